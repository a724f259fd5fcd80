"""`fleet report RUN_DIR`: ``report.html`` (leaderboard, learning curves, the real Gantt beside
the planned one, GPU use, decoding) from the run directory alone."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from fleet.commands._run_dir import run_spec, running_holder
from fleet.runtime.events import read_events
from fleet.errors import UserError
from fleet.report.results import leaderboard_rows
from fleet.report.run_report import Prediction, Report, write_report
from fleet.runtime.control.console import SLOT_NAMES
from fleet.schedule_io import load_profile
from profiler.report import planned


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "report",
        help="write report.html: leaderboard, learning curves, the real Gantt of the run, GPU use",
        description="Write RUN_DIR/report.html (one self-contained page; its PNGs also under RUN_DIR/report/): "
        "the sortable leaderboard, learning curves per model and by family, the Gantt of what really ran "
        "where beside the plan predicted from profile.json, GPU use over time, decoded samples against a "
        "pipeline per model, and the predicted against the measured makespan. Works on a finished, an "
        "interrupted and a running job.",
    )
    parser.add_argument("run_dir", help="the run directory (runs/NAME)")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    report = report_run_dir(Path(args.run_dir))
    best = leaderboard_rows(list(report.models))[:1]
    lead = f"; best: {best[0].id} ({best[0].metric} {best[0].best_metric:.4f})" if best and best[0].best_metric is not None else ""
    print(f"fleet: wrote {report.path} ({report.story.state}, {len(report.models)} models{lead}); "
          f"its images are in {report.path.parent / 'report'}")
    return 0


def report_run_dir(run_dir: Path) -> Report:
    """Write the report of `run_dir`; raises `UserError` for a directory that is not a run's."""
    spec = run_spec(run_dir)
    events = read_events(run_dir / "events.jsonl")
    if not any(e.get("event") == "run_start" for e in events):
        raise UserError(f"{run_dir}: no job has started training here yet (events.jsonl has no run_start)")
    running = running_holder(run_dir) is not None
    return write_report(run_dir, spec, events, running=running, now=time.time(),
                        prediction=prediction(spec, run_dir, events, finished=not running),
                        slot=SLOT_NAMES.get(spec.cluster.device.value, "GPU"))


def prediction(spec, run_dir: Path, events: list[dict], finished: bool) -> Prediction | None:
    """The plan predicted from the run's profile.json (None without one); for a job no longer
    running, also its makespan with the epochs each model really trained."""
    path = run_dir / "profile.json"
    if not path.is_file():
        return None
    rates = load_profile(path)
    plan = planned(spec, rates)
    if not finished:
        return Prediction(plan)
    trained: dict[str, float] = {}
    for event in events:
        if event.get("event") == "epoch" and isinstance(event.get("epoch"), int):
            trained[str(event.get("model"))] = max(trained.get(str(event.get("model")), 0), event["epoch"])
    return Prediction(plan, planned(spec, rates, trained)["makespan_s"] if trained else None)
