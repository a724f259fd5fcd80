"""What `fleet status` and `fleet report` read from a run directory: its spec, its events log
(as far as it is written) and whether a job runs in it now."""

from __future__ import annotations

from pathlib import Path

from fleet.errors import UserError
from fleet.runlock import RunLock
from fleet.spec.asked import asked_path, read_asked, with_asked
from preprocess.grouped import load_run_spec


def run_spec(run_dir: Path):
    """The spec the run directory's jobs ran (its ``spec.yaml``); `UserError` when there is none."""
    spec_file = run_dir / "spec.yaml"
    if not spec_file.is_file():
        raise UserError(f"{run_dir}: not a run directory (no spec.yaml): has a job started in it?")
    asked = read_asked(run_dir)  # spec.yaml holds them too, unless a crash came between the two
    return with_asked(load_run_spec(spec_file, check_paths=False), asked, str(asked_path(run_dir)))




def running_holder(run_dir: Path):
    """The lock holder of the job running in `run_dir` now, or None."""
    lock = RunLock(run_dir, "fleet status")
    holder = lock.holder()
    return holder if holder is not None and not lock.is_stale(holder) else None
