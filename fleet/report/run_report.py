"""`write_report`: ``report.html`` and its PNGs (under ``report/``) for a run directory.

Everything comes from the run directory: ``events.jsonl`` (what ran where and when, every
epoch, every rung decision), ``spec.yaml`` (the models) and, when the caller planned it from
``profile.json``, the predicted plan. It works the same on a finished, an interrupted and a
running job. A run with early stopping gets a section more: the rung chart, the learning
curves with the stops marked, and the model-epochs early stopping saved.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from fleet.atomic import atomic_write_text
from fleet.report import forecast_chart, group_charts, html_page, rung_charts, run_charts
from fleet.report.gantt import write_gantt
from fleet.report.gpu_use import CATEGORIES, gpu_seconds
from fleet.report.html_page import Figure
from fleet.report.prediction_error import PredictionError, compare, forecast_of, last_job, load_forecast
from fleet.report.group_results import GroupResult
from fleet.report.results import ModelResult, epochs_saved, group_results, stopped_early
from fleet.report.rungs import early_stop_setting, has_early_stop, rung_arrivals, rung_records
from fleet.report.run_ensemble import ensemble_section, read_ensemble
from fleet.report.run_story import RunStory, tell_story
from fleet.report.standings import standings
from fleet.report.table import format_duration

FIGURES_DIR = "report"
FORECAST = "forecast.json"


@dataclass(frozen=True)
class Prediction:
    """The plan the policy made from the profile (a ``plan.json`` dict), and its makespan with
    the epochs the models really trained (None when not computed)."""

    plan: dict
    makespan_real_epochs_s: float | None = None


@dataclass(frozen=True)
class Report:
    path: Path
    figures: tuple[Path, ...]
    models: tuple[ModelResult, ...]
    story: RunStory
    prediction_error: PredictionError | None = None  # the last job against its forecast.json
    groups: tuple[GroupResult, ...] = ()  # learning over groups: each group's results, the largest first


def write_report(run_dir: str | os.PathLike, spec, events: Sequence[Mapping], *, running: bool = False,
                 now: float | None = None, prediction: Prediction | None = None, slot: str = "GPU") -> Report:
    """Write ``report.html`` and its PNGs into `run_dir`; what it wrote.

    Raises:
        UserError: a file cannot be written.
    """
    run_dir = Path(run_dir)
    story = tell_story(events, spec.cluster.gpus, now, running)
    models = standings(events, spec.models, story)
    groups = group_results(models, {m.id: m.group for m in spec.models if m.group is not None})
    figures = _draw(run_dir, spec, story, models, prediction, slot)
    sections = [
        ("summary", html_page.key_values(_summary(spec, events, story, models, prediction, slot))),
        ("leaderboard (click a column to sort)", html_page.leaderboard_table(models, groups)),
        ("learning curves", "".join(html_page.figure(f) for f in figures[:2])),
        ("what ran where", "".join(html_page.figure(f) for f in figures[2:4])),
        (f"{slot} use", html_page.figure(figures[4]) + html_page.key_values(_use_rows(story))),
        ("decoding", html_page.figure(figures[5])),
    ]
    if has_early_stop(events):  # without it, the page is as it was
        stops = _draw_early_stop(run_dir, events, models)
        rows = html_page.key_values(_early_stop_rows(spec, events, models))
        sections.insert(3, ("early stopping", rows + "".join(html_page.figure(f) for f in stops)))
        figures += stops
    if groups:  # learning over groups: without them, the page is as it was
        drawn = _drawn(run_dir / FIGURES_DIR, "each group's best metric against its size, coloured by the "
                       "configuration best there", "groups.png", lambda p: group_charts.write_group_chart(groups, p))
        sections.insert(2, ("groups", _groups_section(groups, drawn)))
        figures.append(drawn)
    chosen = read_ensemble(run_dir)
    if chosen is not None:  # `fleet ensemble` (or the spec's ensemble section) wrote ensemble.json
        sections.insert(3 if groups else 2, ("ensemble", ensemble_section(chosen)))
    judged = _judge_forecast(run_dir, events, spec.cluster.gpus, now, running)
    if judged is not None:  # a job that wrote no forecast.json: the page is as it was
        figure = _drawn(run_dir / FIGURES_DIR, "the job's forecast above what it measured, each model one colour",
                        "forecast-gantt.png", lambda p: forecast_chart.write_forecast_gantt(
                            judged[0], judged[1], p, spec.cluster.gpus_per_node, slot))
        at = [heading for heading, _ in sections].index("what ran where") + 1
        sections.insert(at, ("predicted against measured", _prediction_section(judged[0], figure, len(story.jobs))))
        figures.append(figure)
    text = html_page.page(f"fleet: {spec.name}", sections,
                          "Written by `fleet report` from the run directory alone; run it again for a fresh view.")
    path = run_dir / "report.html"
    atomic_write_text(path, text)
    return Report(path, tuple(run_dir / f.file for f in figures), tuple(models), story,
                  judged[0] if judged else None, tuple(groups))


def _draw(run_dir: Path, spec, story: RunStory, models: list[ModelResult], prediction: Prediction | None,
          slot: str) -> list[Figure]:
    folder = run_dir / FIGURES_DIR
    folder.mkdir(parents=True, exist_ok=True)
    gpn = spec.cluster.gpus_per_node
    drawers = [
        ("learning curves of every model, coloured by family", "curves.png", lambda p: run_charts.write_curves(models, p)),
        ("each family's models, named", "curves-by-family.png", lambda p: run_charts.write_family_curves(models, p)),
        ("the run as it happened (from events.jsonl)", "gantt.png",
         lambda p: run_charts.write_run_gantt(story, p, gpn, slot)),
        ("the plan predicted from profile.json (each model's max_epochs)" if prediction else
         "no plan: the run directory has no profile.json", "planned-gantt.png", lambda p: _planned(prediction, p)),
        (f"{slot} use over time", "gpu-use.png", lambda p: run_charts.write_gpu_use(story, p, slot)),
        ("training samples decoded: fleet against a pipeline per model", "decoded.png",
         lambda p: run_charts.write_decoded(story.decoded, _per_model_samples(models), p)),
    ]
    return [_drawn(folder, caption, name, draw) for caption, name, draw in drawers]


def _drawn(folder: Path, caption: str, name: str, draw) -> Figure:
    """`draw(path)` into `folder`/`name`, and the figure the page shows."""
    target = folder / name
    draw(str(target))
    return Figure(caption, f"{FIGURES_DIR}/{name}", target.read_bytes())


def _groups_section(groups: list[GroupResult], chart: Figure) -> str:
    """Learning over groups: how many groups are done, the chart, and one row per group."""
    done = sum(g.done for g in groups)
    wins: dict[str, int] = {}
    for g in groups:
        if g.best_configuration is not None:
            wins[g.best_configuration] = wins.get(g.best_configuration, 0) + 1
    often = ", ".join(f"{c} ({n})" for c, n in sorted(wins.items(), key=lambda w: (-w[1], w[0]))[:5])
    rows = [("groups", f"{len(groups)}, {done} done (every configuration ended), the largest first below"),
            ("best configuration most often", often or "none yet (no group has finished an epoch)")]
    return html_page.key_values(rows) + html_page.figure(chart) + html_page.groups_table(groups)


def _draw_early_stop(run_dir: Path, events: Sequence[Mapping], models: list[ModelResult]) -> list[Figure]:
    arrivals = rung_arrivals(rung_records(events))
    folder = run_dir / FIGURES_DIR
    return [
        _drawn(folder, "models per rung over time: those that reached each rung", "rungs.png",
               lambda p: rung_charts.write_rung_chart(arrivals, p)),
        _drawn(folder, "validation accuracy per epoch; x: where early stopping stopped a model", "curves-stopped.png",
               lambda p: rung_charts.write_stopped_curves(models, p)),
    ]


def _early_stop_rows(spec, events: Sequence[Mapping], models: list[ModelResult]) -> list[tuple[str, str]]:
    """The method, the models it stopped, and the model-epochs trained and saved."""
    setting = early_stop_setting(events)
    knobs = ", ".join(f"{k} {v}" for k, v in setting.items() if k != "method" and v is not None)
    method = f"{setting['method']} ({knobs})" if setting else "none recorded in run_start; rung decisions recorded"
    saved = epochs_saved(models, {m.id: m.train.max_epochs for m in spec.models})
    return [
        ("method", method),
        ("stopped", f"{sum(stopped_early(m) for m in models)} of {len(models)} models, at a rung"),
        ("model-epochs", f"model-epochs trained: {sum(m.epochs for m in models)}; "
                         f"saved by early stopping: at most {saved}"),
    ]


def _planned(prediction: Prediction | None, path: str) -> None:
    if prediction is not None:
        write_gantt(prediction.plan, path)
        return
    run_charts.write_note("no profile.json: no predicted plan", path)  # the page keeps its shape


def _per_model_samples(models: list[ModelResult]) -> int:
    return sum(int(e.get("samples") or 0) for m in models for e in m.history)


def _summary(spec, events: Sequence[Mapping], story: RunStory, models: list[ModelResult],
             prediction: Prediction | None, slot: str) -> list:
    converged = sum(m.converged for m in models)
    policies = [str(e.get("policy")) for e in events if e.get("event") == "run_start" and e.get("policy")]
    rows = [
        ("state", {"finished": "finished", "interrupted": "interrupted (checkpointed; run again to resume)",
                   "killed": "stopped without finishing (killed?); run again to resume",
                   "running": "running"}.get(story.state, story.state)),
        ("policy", policies[-1] if policies else str(spec.scheduler.policy)),
        ("cluster", f"{spec.cluster.nodes} node(s) x {spec.cluster.gpus_per_node} {slot}(s), {spec.cluster.device.value}"),
        ("models", f"{len(models)}, {converged} converged; {sum(m.epochs for m in models)} epochs trained"),
        ("jobs", f"{len(story.jobs)} (the first and each resume)"),
        ("measured makespan", f"{story.training_s:,.1f} s ({format_duration(story.training_s)}) over "
                              f"{len(story.rounds)} round(s)"),
    ]
    if prediction is not None:
        planned = float(prediction.plan.get("makespan_s", 0.0))
        rows.append(("predicted makespan", f"{planned:,.1f} s with each model's max_epochs"
                     + (f" (measured / predicted: {story.training_s / planned:.2f})" if planned > 0 else "")))
        if prediction.makespan_real_epochs_s is not None:
            rows.append(("predicted, real epochs", f"{prediction.makespan_real_epochs_s:,.1f} s with the epochs the "
                         "models really trained (early stops included)"))
    rows += _forecast_rows(events, story)
    rows.append(("samples decoded", f"{story.decoded:,} by fleet; {_per_model_samples(models):,} with a pipeline per model"))
    return rows


def _forecast_rows(events: Sequence[Mapping], story: RunStory) -> list[tuple[str, str]]:
    """The job's forecast of itself (its run_start's), beside the measured makespan when the
    run was one job that finished (a resumed job forecasts only the work left to it)."""
    starts = [e for e in events if e.get("event") == "run_start" and isinstance(e.get("forecast"), Mapping)]
    if not starts:
        return []
    forecast = starts[-1]["forecast"]
    try:
        predicted, (low, high) = float(forecast["makespan_s"]), (float(x) for x in forecast["range_s"])
        spread = float(forecast.get("rate_spread", 0.0))
    except (KeyError, TypeError, ValueError):
        return []
    text = (f"{predicted:,.1f} s by {forecast.get('policy', '?')} (10-90 %: {low:,.1f}-{high:,.1f} s, rates "
            f"within ±{100 * spread:.0f} %; start-up, validation and shared cores not modelled)")
    if len(story.jobs) == 1 and story.state == "finished" and predicted > 0:
        text += f"; measured / forecast: {story.training_s / predicted:.2f}"
    return [("the job's forecast", text)]


def _judge_forecast(run_dir: Path, events: Sequence[Mapping], gpus: int, now: float | None,
                    running: bool) -> tuple[PredictionError, RunStory] | None:
    """The last job against its forecast.json, and that job's story; None where the file is
    missing, malformed or an earlier job's, or does not fit the run's GPUs."""
    job = last_job(events)
    forecast = forecast_of(load_forecast(run_dir / FORECAST), job)
    if forecast is None:
        return None
    story = tell_story(job, gpus, now, running)
    error = compare(forecast, story)
    return None if error is None else (error, story)


def _prediction_section(error: PredictionError, figure: Figure, jobs: int) -> str:
    """The chart, the ratio and the largest source, every source, and each model's epochs and starts."""
    rows = [("makespan", error.headline()), ("largest source of the error", error.sentence())]
    if jobs > 1:
        rows.append(("the job", f"the last of {jobs} jobs: a resumed job forecasts the models left to it"))
    if error.state != "finished":
        state = {"running": "is running", "interrupted": "was interrupted (checkpointed)"}.get(error.state, "was killed")
        rows.append(("note", f"the job {state}: it did part of the work forecast"))
    sources = [(s.name, f"{s.seconds:+,.2f}", f"{s.measured_gpu_s:,.2f}", f"{s.predicted_gpu_s:,.2f}")
               for s in error.sources]
    sources.append(("all", f"{sum(s.seconds for s in error.sources):+,.2f}", "", ""))
    models = [(m.model, _maybe(m.predicted_epoch_s), _maybe(m.measured_epoch_s), _maybe(m.pace, "x"),
               _epochs(m.predicted_epochs), _epochs(m.measured_epochs),
               f"{m.predicted_start_s:.2f} ({m.predicted_starts})", f"{m.measured_start_s:.2f} ({m.measured_starts})")
              for m in error.models]
    return (html_page.figure(figure) + html_page.key_values(rows)
            + html_page.table(("source", "seconds of the error", "measured GPU-s (idle charged)",
                               "predicted GPU-s (idle charged)"), sources, (False, True, True, True))
            + html_page.table(("model", "predicted s/epoch", "measured s/epoch", "measured / predicted GPU-s per epoch",
                               "epochs predicted", "epochs measured", "start s predicted (stays)",
                               "start s measured (stints)"), models, (False,) + (True,) * 7))


def _maybe(value: float | None, unit: str = "") -> str:
    return "-" if value is None else f"{value:.2f}{unit}"


def _epochs(value: float) -> str:
    """``2``, ``1.5``, ``1.33``."""
    return f"{value:.2f}".rstrip("0").rstrip(".")


def _use_rows(story: RunStory) -> list[tuple[str, str]]:
    totals = gpu_seconds(story)
    whole = sum(totals.values()) or 1.0
    return [(c, f"{totals[c]:,.1f} GPU-s ({100 * totals[c] / whole:.1f}%)") for c in CATEGORIES]
