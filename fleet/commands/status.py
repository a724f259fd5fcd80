"""`fleet status RUN_DIR`: what a job is doing now, from its run directory alone."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from fleet.commands._args import positive_int
from fleet.commands._run_dir import run_spec, running_holder
from fleet.runtime.events import read_events
from fleet.report.status import JobStatus, render, replay, time_left
from fleet.runtime.control.console import SLOT_NAMES


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "status",
        help="what a job in a run directory is doing now",
        description="Each model's state (waiting, training on which GPUs, checkpointed, converged; with early "
        "stopping, held at or stopped at a rung), epoch and best validation accuracy, the job's progress and, "
        "with early stopping, how its rungs fill, read from the run directory alone: it works on a batch job "
        "running on other nodes, a finished one and an interrupted one.",
    )
    parser.add_argument("run_dir", help="the run directory (runs/NAME)")
    parser.add_argument("--watch", nargs="?", type=positive_int, const=5, metavar="SECONDS",
                        help="print it again every SECONDS (default 5) until the job ends or Ctrl-C")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir)
    spec = run_spec(run_dir)
    max_epochs = {m.id: m.train.max_epochs for m in spec.models}
    groups = {m.id: m.group for m in spec.models if m.group is not None}
    slot = SLOT_NAMES.get(spec.cluster.device.value, "GPU")
    while True:
        job = replay(read_events(run_dir / "events.jsonl"), max_epochs, groups)
        running, headline = job_state(run_dir, job)
        print("\n".join(render(job, headline, slot)), flush=True)
        if not args.watch or not running:
            return 0
        try:
            time.sleep(args.watch)
        except KeyboardInterrupt:
            return 0
        print()


def job_state(run_dir: Path, job: JobStatus) -> tuple[bool, str]:
    """Whether a job runs in `run_dir` now (its lock's holder lives), and the headline."""
    holder = running_holder(run_dir)
    now = time.time()
    if holder is not None:
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
