"""`fleet status RUN_DIR`: what a job is doing now, from its run directory alone."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from fleet.commands._args import positive_int
from fleet.errors import UserError
from fleet.report.status import JobStatus, render, replay, time_left
from fleet.runlock import RunLock
from fleet.runtime.control.console import SLOT_NAMES
from fleet.spec import load_spec


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "status",
        help="what a job in a run directory is doing now",
        description="Each model's state (waiting, training on which GPUs, checkpointed, converged), epoch and "
        "best validation accuracy, and the job's progress, read from the run directory alone: it works on a "
        "batch job running on other nodes, a finished one and an interrupted one.",
    )
    parser.add_argument("run_dir", help="the run directory (runs/NAME)")
    parser.add_argument("--watch", nargs="?", type=positive_int, const=5, metavar="SECONDS",
                        help="print it again every SECONDS (default 5) until the job ends or Ctrl-C")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir)
    spec_file = run_dir / "spec.yaml"
    if not spec_file.is_file():
        raise UserError(f"{run_dir}: not a run directory (no spec.yaml): has a job started in it?")
    spec = load_spec(spec_file, check_paths=False)
    max_epochs = {m.id: m.train.max_epochs for m in spec.models}
    slot = SLOT_NAMES.get(spec.cluster.device.value, "GPU")
    while True:
        job = replay(read_events(run_dir / "events.jsonl"), max_epochs)
        running, headline = job_state(run_dir, job)
        print("\n".join(render(job, headline, slot)), flush=True)
        if not args.watch or not running:
            return 0
        try:
            time.sleep(args.watch)
        except KeyboardInterrupt:
            return 0
        print()


def read_events(path: Path) -> list[dict]:
    """The log's records; a line cut off by a job that is writing it is left out."""
    if not path.exists():
        return []
    events = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            continue
    return events


def job_state(run_dir: Path, job: JobStatus) -> tuple[bool, str]:
    """Whether a job runs in `run_dir` now (its lock's holder lives), and the headline."""
    lock = RunLock(run_dir, "fleet status")
    holder = lock.holder()
    now = time.time()
    if holder is not None and not lock.is_stale(holder):
        left = time_left(job, now)
        since = f", {now - job.started:,.0f} s into this job" if job.started else ""
        pace = f"; about {left:,.0f} s left at this job's pace" if left is not None else ""
        return True, f"{run_dir}: running: {holder.describe()}{since}{pace}"
    if job.ended is not None:
        how = "interrupted (checkpointed; run it again to resume)" if job.ended.get("interrupted") else "finished"
        return False, f"{run_dir}: {how} after {job.ended.get('makespan', 0):,.1f} s, {job.ended.get('rounds', 0)} round(s)"
    if job.jobs:
        return False, f"{run_dir}: not running: its last job stopped without finishing (killed?); run it again to resume"
    return False, f"{run_dir}: no job has started training here yet"
