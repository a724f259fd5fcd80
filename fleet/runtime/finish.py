"""What the end of a job leaves its user: the best models on the console and ``report.html``.

Rank 0 writes them once every rank is done, while the other ranks exit (their interpreters'
teardown takes a second or two, and the report's charts as long: side by side, not one after
the other); `fleet report` redraws the page of any run directory.
"""

from __future__ import annotations

import csv
import json
import time
from pathlib import Path

from fleet.atomic import atomic_write_json
from fleet.errors import UserError
from fleet.prediction import planned
from fleet.report.group_results import group_table
from fleet.report.results import group_results, read_results
from fleet.report.run_ensemble import build_ensemble, say_ensemble, write_ensemble
from fleet.report.run_report import Prediction, Report, write_report
from fleet.report.table import format_table
from fleet.runtime.control.console import SLOT_NAMES
from fleet.runtime.events import read_events
from fleet.runtime.launch.signals import EXIT_CHECKPOINTED
from fleet.schedule_io import load_profile


def summarize_job(spec, run_dir: Path, code: int) -> None:
    """After a job with exit `code` (MPI finalized: nothing here may end the job): the best
    models (a finished job) and report.html (a finished or checkpointed one), whose drawing
    seconds go into results.json's ``overhead_s.report``. A failure is a note, never the job's."""
    try:
        if code == 0:
            print_leaderboard_top(run_dir)
            ensemble_at_end(spec, run_dir)
        if code not in (0, EXIT_CHECKPOINTED):
            return
        started = time.monotonic()
        report = write_run_page(run_dir, spec, running=False)
        charts = len(report.figures)
        print(f"fleet: report: {report.path} (learning curves, what ran where, {charts} charts)", flush=True)
        _record_report_seconds(run_dir / "results.json", time.monotonic() - started)
    except Exception as exc:  # noqa: BLE001 - the training is done and saved; these are extras
        print(f"fleet: note: no report.html: {exc}", flush=True)


def ensemble_at_end(spec, run_dir: Path) -> None:
    """With the spec's ``ensemble`` section: the run's greedy ensemble (ensemble.json) and its
    line on the console; where it cannot be made, a note saying why."""
    if spec.ensemble is None:
        return
    try:
        doc = build_ensemble(run_dir, spec.ensemble.size, spec.ensemble.from_)
        path = write_ensemble(run_dir, doc)
    except UserError as exc:
        print(f"fleet: note: no ensemble: {exc}", flush=True)
        return
    say_ensemble(doc, path)


def write_run_page(run_dir: Path, spec, running: bool) -> Report:
    """Write `run_dir`'s report.html; `UserError` where no job has started training there."""
    events = read_events(run_dir / "events.jsonl")
    if not any(e.get("event") == "run_start" for e in events):
        raise UserError(f"{run_dir}: no job has started training here yet (events.jsonl has no run_start)")
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


def print_leaderboard_top(run_dir: Path, count: int = 5) -> None:
    """The best `count` models of a finished run (from its leaderboard.csv), and where the rest
    is; with groups, the best configuration of each group instead (`print_group_top`)."""
    if print_group_top(run_dir):
        return
    path = run_dir / "leaderboard.csv"
    try:
        rows = list(csv.DictReader(path.read_text(encoding="utf-8").splitlines()))
    except OSError:
        return
    if not rows:
        return
    shown = [(r["rank"], r["id"], r["family"],
              f"{r['metric']} {float(r['best_metric']):.4f}" if r["best_metric"] else "-", r["best_epoch"], r["epochs"],
              r.get("end") or "-")
             for r in rows[:count]]
    print(f"fleet: the best {len(shown)} of {len(rows)} models (all of them: {path}; status: fleet status {run_dir})\n"
          + format_table(("rank", "model", "family", "best", "at epoch", "epochs", "end"), shown), flush=True)


def print_group_top(run_dir: Path) -> bool:
    """With groups (`data.group_by`): one line per group, the largest first, with its best
    configuration (at most `SHOWN_GROUPS` groups); whether it printed (False without groups)."""
    try:
        run = read_results(run_dir)
    except (OSError, ValueError):
        return False
    groups = group_results(run.models, run.groups)
    if not groups:
        return False
    done = sum(g.done for g in groups)
    print(f"fleet: the best configuration of each group, the largest first ({done}/{len(groups)} groups done; "
          f"every model ranked within its group: {run_dir / 'leaderboard.csv'}; per group: results.json's "
          f"group_results)\n" + "\n".join(group_table(groups)), flush=True)
    return True


def _record_report_seconds(path: Path, seconds: float) -> None:
    try:
        results = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    results.setdefault("overhead_s", {})["report"] = round(seconds, 3)
    atomic_write_json(path, results)
