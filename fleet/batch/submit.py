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


SINFO_FORMAT = "%P|%D|%s"  # partition (the default marked *), its nodes, the job sizes it takes


def partition_verdict(sinfo_output: str, partition: str | None, nodes: int) -> str | None:
    """Why a job of `nodes` nodes would never start in `partition` (None: the default), from
    ``sinfo -h -o SINFO_FORMAT``; None when it fits or sinfo does not say.

    A job asking for more nodes than a partition has, or than its job sizes allow, is accepted
    by sbatch and pends for ever (reason PartitionNodeLimit) on most sites.
    """
    rows = [line.split("|") for line in sinfo_output.splitlines() if line.count("|") == 2]
    named = [(name.rstrip("*"), count, sizes) for name, count, sizes in rows
             if (partition is None and name.endswith("*")) or name.rstrip("*") == partition]
    if not named:
        return None
    name = named[0][0]
    total = sum(int(count) for _, count, _ in named if count.isdigit())
    largest = _largest_job(named[0][2])
    if total and nodes > total:
        return f"the spec asks for {nodes} nodes and partition {name!r} has {total} (sinfo)"
    if largest is not None and nodes > largest:
        return f"the spec asks for {nodes} nodes and partition {name!r} takes jobs of at most {largest} (sinfo)"
    return None


def _largest_job(sizes: str) -> int | None:
    """``1-infinite`` -> None, ``1-4`` -> 4, ``2`` -> 2; None where it cannot tell."""
    top = sizes.rpartition("-")[2].strip()
    return int(top) if top.isdigit() else None


def check_partition(system: BatchSystem, partition: str | None, nodes: int) -> None:
    """Stop before submitting a Slurm job that could never start (see `partition_verdict`);
    nothing where sinfo is missing or fails.

    Raises:
        UserError: the job does not fit the partition.
    """
    sinfo = shutil.which("sinfo")
    if system is not BatchSystem.SLURM or sinfo is None:
        return
    try:
        done = subprocess.run([sinfo, "-h", "-o", SINFO_FORMAT], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return
    why = partition_verdict(done.stdout, partition, nodes) if done.returncode == 0 else None
    if why is not None:
        raise UserError(f"cluster.nodes: {why}; the job would wait for ever (PartitionNodeLimit): "
                        "ask for fewer nodes, or another partition with --partition")
