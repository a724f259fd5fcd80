"""`fleet report RUN_DIR`: ``report.html`` (leaderboard, learning curves, the real Gantt beside
the planned one, GPU use, decoding) from the run directory alone."""

from __future__ import annotations

import argparse
from pathlib import Path

from fleet.commands._run_dir import run_spec, running_holder
from fleet.report.results import leaderboard_rows
from fleet.report.run_report import Report
from fleet.runtime.finish import write_run_page


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "report",
        help="write report.html: leaderboard, learning curves, the real Gantt of the run, GPU use",
        description="Write RUN_DIR/report.html (one self-contained page; its PNGs also under RUN_DIR/report/): "
        "the sortable leaderboard, learning curves per model and by family, the Gantt of what really ran "
        "where beside the plan predicted from profile.json, GPU use over time, decoded samples against a "
        "pipeline per model, and the predicted against the measured makespan (with the job's forecast.json: its "
        "predicted Gantt above the measured one, and the largest source of the error); with early stopping, the models "
        "per rung over time, the learning curves with the stops marked and the model-epochs saved; with "
        "data.group_by, each group's best configuration, largest group first, and a chart of group size against "
        "best metric. Works on a "
        "finished, an interrupted and a running job.",
    )
    parser.add_argument("run_dir", help="the run directory (runs/NAME)")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    report = report_run_dir(Path(args.run_dir))
    best = leaderboard_rows(list(report.models))[:1]
    lead = f"; best: {best[0].id} ({best[0].metric} {best[0].best_metric:.4f})" if best and best[0].best_metric is not None else ""
    if report.groups:  # models of different groups learn different data: no best across them
        lead = (f"; {len(report.groups)} groups, {sum(g.done for g in report.groups)} done: the best configuration "
                "of each in the section 'groups'")
    print(f"fleet: wrote {report.path} ({report.story.state}, {len(report.models)} models{lead}); "
          f"its images are in {report.path.parent / 'report'}")
    error = report.prediction_error
    if error is not None:
        print(f"fleet: forecast: {error.headline()}; largest source of the error: {error.sentence()}")
    return 0


def report_run_dir(run_dir: Path) -> Report:
    """Write the report of `run_dir`; raises `UserError` for a directory that is not a run's."""
    return write_run_page(run_dir, run_spec(run_dir), running=running_holder(run_dir) is not None)
