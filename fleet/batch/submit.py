"""Submitting a written batch script: ``sbatch --parsable SCRIPT`` or ``bsub < SCRIPT``."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from fleet.batch.job import BatchSystem
from fleet.errors import UserError

SUBMIT_COMMANDS = {BatchSystem.SLURM: "sbatch", BatchSystem.LSF: "bsub"}


def require_submitter(system: BatchSystem) -> str:
    """The path of sbatch/bsub; UserError naming it when it is not on PATH."""
    command = SUBMIT_COMMANDS[system]
    found = shutil.which(command)
    if found is None:
        raise UserError(
            f"--scheduler {system.value}: {command} not found on PATH (not a {system.value} login node?); "
            f"use --dry-run to write the script only"
        )
    return found


def submit(system: BatchSystem, script: Path) -> str:
    """Submit `script` and return the job id; UserError with the submitter's message if it fails."""
    command = require_submitter(system)
    if system is BatchSystem.SLURM:
        done = subprocess.run(
            [command, "--parsable", str(script)], stdin=subprocess.DEVNULL, capture_output=True, text=True
        )
    else:  # bsub reads the #BSUB lines only from standard input
        with open(script) as stdin:
            done = subprocess.run([command], stdin=stdin, capture_output=True, text=True)
    if done.returncode != 0:
        first = (done.stderr.strip() or done.stdout.strip() or "no message").splitlines()[0]
        raise UserError(f"{SUBMIT_COMMANDS[system]} {script} failed (exit {done.returncode}): {first}")
    return parse_job_id(system, done.stdout)


def parse_job_id(system: BatchSystem, stdout: str) -> str:
    """``sbatch --parsable``: ``ID`` or ``ID;CLUSTER``; bsub: ``Job <ID> is submitted to queue <Q>.``"""
    if system is BatchSystem.SLURM:
        match = re.search(r"^(\d+)(?:;\S+)?\s*$", stdout.strip(), re.MULTILINE)
    else:
        match = re.search(r"Job <(\d+)>", stdout)
    if match is None:
        raise UserError(f"{SUBMIT_COMMANDS[system]} printed no job id: {stdout.strip()[:200]!r}")
    return match.group(1)
