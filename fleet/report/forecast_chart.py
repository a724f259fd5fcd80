"""The job's predicted Gantt (forecast.json) above its measured one, on one time axis, each
model one colour in both, with the makespans' ratio and the largest source of the error under
them. Drawn by the Gantt code of `gantt` (a plan) and `run_charts` (a run's story)."""

from __future__ import annotations

from fleet.report._figures import pyplot, save_png
from fleet.report.gantt import draw_plan, model_colors
from fleet.report.prediction_error import Forecast, PredictionError, seconds
from fleet.report.run_charts import draw_run
from fleet.report.run_story import RunStory


def forecast_plan(forecast: Forecast, gpus: int, gpus_per_node: int) -> dict:
    """The forecast as the plan `draw_plan` draws: its rounds, each with its members."""
    rounds = [{"index": index, "start": start, "members": []} for index, start, _ in forecast.rounds]
    by_index = {r["index"]: r for r in rounds}
    for stay in forecast.stays:
        member = {"model": stay.model, "gpus": list(stay.gpus), "start": stay.start, "end": stay.end,
                  "outcome": stay.outcome}
        if stay.round not in by_index:  # a round the file does not list: drawn, no line for it
            by_index[stay.round] = {"index": stay.round, "start": stay.start, "members": []}
            rounds.append(by_index[stay.round])
        by_index[stay.round]["members"].append(member)
    return {"policy": forecast.policy, "makespan_s": forecast.makespan_s, "total_gpus": gpus,
            "gpus_per_node": gpus_per_node, "rounds": sorted(rounds, key=lambda r: r["start"])}


def write_forecast_gantt(error: PredictionError, story: RunStory, path: str, gpus_per_node: int,
                         slot: str = "GPU") -> None:
    """Write the two charts, predicted above measured, to `path` (PNG); `story` is the job's
    that made the forecast.

    Raises:
        UserError: the file cannot be written.
    """
    plt = pyplot()
    forecast = error.forecast
    rows = max(2.5, 0.35 * story.gpus + 1.2)
    fig, (predicted, measured) = plt.subplots(2, 1, figsize=(12, 2 * rows + 1.0), sharex=True)
    colors = model_colors(plt, [s.model for s in forecast.stays] + [s.model for s in story.stints])
    end = max([error.predicted_s, story.end, *(s.end for s in forecast.stays)]) or 1.0
    draw_plan(predicted, forecast_plan(forecast, story.gpus, gpus_per_node), colors, end, slot)
    predicted.set_xlabel("")
    predicted.set_title(f"predicted by {forecast.policy} before the job started (forecast.json): "
                        f"{seconds(error.predicted_s)}; hatched: checkpointed, not yet converged", fontsize=9)
    draw_run(measured, story, gpus_per_node, slot, colors, end)
    measured.set_xlabel("seconds from the job's start (the forecast's: from its first step)")
    measured.set_title(f"measured (events.jsonl): {seconds(error.measured_s)}; v: checkpoint, x: regroup",
                       fontsize=9)
    fig.text(0.01, 0.01, f"{error.headline()}\nlargest source: {error.sentence()}", fontsize=9, va="bottom")
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    save_png(fig, path)
