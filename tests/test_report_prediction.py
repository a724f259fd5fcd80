"""A job's forecast (forecast.json) against what it measured: the makespans, each model's
seconds per epoch and starts, the error split into sources that add up to it, the largest
named; and `fleet report`'s section for it. Forecasts and logs are hand-made, in the formats
docs/run-directory.md gives."""

from __future__ import annotations

import argparse
import json
import math
import re

import pytest
import yaml

from fleet.commands import report as report_command
from fleet.commands.report import report_run_dir
from fleet.report.prediction_error import (
    GAPS, PACE, SOURCES, STARTS, compare, forecast_of, last_job, load_forecast, read_forecast,
)
from fleet.report.run_story import tell_story


def event(kind: str, at: float, **fields) -> dict:
    """A record of events.jsonl, `at` seconds after the job started."""
    return {"event": kind, "time": 5000.0 + at, **fields}


def epoch(at: float, model: str, number: int, wall: float, **extra) -> dict:
    return event("epoch", at, model=model, epoch=number, epoch_s=wall, samples_per_s=100.0,
                 stream_samples_per_s=100.0, train_loss=1.0 / number, val_loss=1.0 / number,
                 val_accuracy=0.1 * number, samples=extra.pop("samples", 100), checkpoint_s=extra.pop("checkpoint_s", 0.0),
                 **extra)


def member(model: str, gpus: list[int], start: float, end: float, epochs: tuple[float, float], round_: int = 0,
           released: float | None = None, outcome: str = "converged", **extra) -> dict:
    return {"model": model, "round": round_, "gpus": gpus, "start": start, "end": end,
            "released": end if released is None else released, "outcome": outcome, "epochs": list(epochs), **extra}


def forecast_doc(members: list[dict], makespan: float, rounds: list[dict] | None = None) -> dict:
    return {"schema": 1, "policy": "fleet-g", "makespan_s": makespan, "range_s": [makespan, makespan * 1.1],
            "rate_spread": 0.1, "draws": 8, "candidates": {}, "members": members,
            "rounds": rounds if rounds is not None else [{"index": 0, "start": 0.0, "end": makespan}]}


def run_start(makespan: float) -> dict:
    return event("run_start", 0.0, policy="fleet-g", forecast={"policy": "fleet-g", "makespan_s": makespan,
                                                              "range_s": [makespan, makespan * 1.1],
                                                              "rate_spread": 0.1, "draws": 8, "candidates": {}})


# Four models on four GPUs, each predicted to train 2 epochs in 10 s. Measured: each starts in
# 0.5 s; a, c and d train as predicted, b twice as slowly while the other three GPUs wait.
STRAGGLER_FORECAST = forecast_doc([member(m, [g], 0.0, 10.0, (0.0, 2.0)) for g, m in enumerate("abcd")], 10.0)


def straggler_log() -> list[dict]:
    log = [run_start(10.0), event("round_start", 0.0, index=0)]
    for gpu, model in enumerate("abcd"):
        log.append(event("member_start", 0.0, model=model, gpus=[gpu], stream=0))
    for model in "acd":
        log += [epoch(5.5, model, 1, 5.0, start_s=0.5), epoch(10.5, model, 2, 5.0),
                event("member_left", 10.5, model=model, converged=True, epochs=2, epoch_samples=0)]
    log += [epoch(10.5, "b", 1, 10.0, start_s=0.5), epoch(20.5, "b", 2, 10.0),
            event("member_left", 20.5, model="b", converged=True, epochs=2, epoch_samples=0),
            event("run_end", 20.5, makespan=20.5, interrupted=False)]
    return log


def judged(doc: dict, log: list[dict], gpus: int):
    forecast = forecast_of(read_forecast(doc), last_job(log))
    assert forecast is not None
    return compare(forecast, tell_story(last_job(log), gpus))


def test_a_model_training_twice_as_slowly_as_predicted_is_named():
    error = judged(STRAGGLER_FORECAST, straggler_log(), gpus=4)
    assert (error.predicted_s, error.measured_s, error.ratio) == (10.0, 20.5, pytest.approx(2.05))
    sources = {s.name: s.seconds for s in error.sources}
    assert tuple(sources) == SOURCES
    assert sum(sources.values()) == pytest.approx(10.5)  # the sources add up to the error
    # the three GPUs idle while b trains on are charged to b, whose training is 20 of its 20.5 s
    assert sources[PACE] == pytest.approx((20 + 30 * 20 / 20.5 - 10) / 4)
    assert sources[STARTS] == pytest.approx((4 * 0.5 + 30 * 0.5 / 20.5) / 4)
    assert sources[GAPS] == pytest.approx(0.0)
    assert error.largest.name == PACE
    assert error.sentence() == "training pace: epochs took 1.25x the predicted time (most: b 2.0x) (+9.82 s of the +10.5 s)"
    times = {m.model: m for m in error.models}
    assert (times["b"].predicted_epoch_s, times["b"].measured_epoch_s, times["b"].pace) == (5.0, 10.0, 2.0)
    assert (times["a"].measured_epoch_s, times["a"].pace) == (5.0, 1.0)
    assert error.headline() == "measured 20.5 s against 10.0 s predicted (2.05x)"


def restored_forecast(**launched) -> dict:
    """a on one GPU: 1.5 epochs in 6 s, checkpointed (0.5 s), restored in 0.5 s for round 1's
    last half epoch (2 s): 4 s an epoch predicted, 0.5 s of starts."""
    return forecast_doc([member("a", [0], 0.0, 6.0, (0.0, 1.5), released=6.5, outcome="checkpointed"),
                         member("a", [0], 7.0, 9.0, (1.5, 2.0), round_=1, **launched)], 9.0,
                        [{"index": 0, "start": 0.0, "end": 6.5}, {"index": 1, "start": 6.5, "end": 9.0}])


def restored_log() -> list[dict]:
    """a measured: 1 s to its first step, an epoch of 4 s, half an epoch more (3 s) before its
    checkpoint (0.5 s); restored, 1.5 s to its first step and its last half epoch in 2.5 s."""
    return [run_start(9.0), event("round_start", 0.0, index=0),
            event("member_start", 0.0, model="a", gpus=[0], stream=0),
            epoch(5.0, "a", 1, 4.5, start_s=1.0),
            event("checkpoint", 8.0, model="a"),
            event("member_left", 8.5, model="a", converged=False, epochs=1, epoch_samples=50, checkpoint_s=0.5),
            event("round_start", 8.5, index=1),
            event("member_start", 8.5, model="a", gpus=[0], stream=1),
            epoch(12.5, "a", 2, 2.5, start_s=1.5),
            event("member_left", 12.6, model="a", converged=True, epochs=2, epoch_samples=0),
            event("run_end", 12.6, makespan=12.6, interrupted=False)]


@pytest.mark.parametrize("launched", [{}, {"launched": 6.5}], ids=["inferred", "recorded"])
def test_starts_and_partly_trained_epochs(launched):
    error = judged(restored_forecast(**launched), restored_log(), gpus=1)
    (a,) = error.models
    assert (a.predicted_start_s, a.predicted_starts) == (0.5, 2)  # the restore; the first start costs nothing
    assert (a.measured_start_s, a.measured_starts) == (2.5, 2)
    assert (a.predicted_epochs, a.predicted_epoch_s) == (2.0, 4.0)
    # 4 s (the epoch's 4.5 s from its first step) + 3 s for half an epoch; then 2.5 s for the other half
    assert (a.measured_epochs, a.measured_epoch_s) == (2.0, pytest.approx(9.5 / 2))
    sources = {s.name: s.seconds for s in error.sources}
    assert sum(sources.values()) == pytest.approx(12.6 - 9.0)
    assert sources[STARTS] == pytest.approx(2.0) and sources["checkpoints"] == pytest.approx(0.0)
    assert sources[PACE] == pytest.approx(1.5) and sources["epochs trained"] == pytest.approx(0.0)
    assert error.largest.name == STARTS
    assert error.sentence().startswith("start and restore: 2 starts took 1.25 s each from launch to first step, "
                                       "0.25 s predicted (most: a 2.5 s)")


GOOD = restored_forecast()
BAD_FORECASTS = {
    "not a mapping": [GOOD],
    "another schema": {**GOOD, "schema": 2},
    "no members": {k: v for k, v in GOOD.items() if k != "members"},
    "members not a list": {**GOOD, "members": {"a": 1}},
    "gpus not numbers": {**GOOD, "members": [{**GOOD["members"][0], "gpus": ["0"]}]},
    "a time that is text": {**GOOD, "makespan_s": "9"},
    "a time that is true": {**GOOD, "members": [{**GOOD["members"][0], "start": True}]},
    "a time that is NaN": {**GOOD, "members": [{**GOOD["members"][0], "end": math.nan}]},
    "an end before the start": {**GOOD, "members": [{**GOOD["members"][0], "end": -1.0}]},
    "released before the end": {**GOOD, "members": [{**GOOD["members"][0], "released": 1.0}]},
    "epochs backwards": {**GOOD, "members": [{**GOOD["members"][0], "epochs": [1.0, 0.0]}]},
    "one epoch": {**GOOD, "members": [{**GOOD["members"][0], "epochs": [1.0]}]},
    "model not text": {**GOOD, "members": [{**GOOD["members"][0], "model": 3}]},
    "a range of one": {**GOOD, "range_s": [1.0]},
    "rounds missing": {k: v for k, v in GOOD.items() if k != "rounds"},
    "a member not a mapping": {**GOOD, "members": [1]},
}


@pytest.mark.parametrize("doc", BAD_FORECASTS.values(), ids=BAD_FORECASTS.keys())
def test_a_malformed_forecast_is_none(doc, tmp_path):
    assert read_forecast(GOOD) is not None
    assert read_forecast(doc) is None
    (tmp_path / "forecast.json").write_text(json.dumps(doc))
    assert load_forecast(tmp_path / "forecast.json") is None


def test_a_forecast_file_that_is_missing_or_no_json_is_none(tmp_path):
    assert load_forecast(tmp_path / "forecast.json") is None
    (tmp_path / "forecast.json").write_text('{"schema": 1, "members": [')
    assert load_forecast(tmp_path / "forecast.json") is None
    (tmp_path / "forecast.json").write_bytes(b"\xff\xfe\x00")
    assert load_forecast(tmp_path / "forecast.json") is None


def test_an_earlier_jobs_forecast_or_one_for_more_gpus_is_not_compared():
    forecast = read_forecast(STRAGGLER_FORECAST)
    resumed = [*straggler_log(), event("run_start", 30.0, policy="fleet-g")]  # the resume made no forecast
    assert forecast_of(forecast, last_job(resumed)) is None
    other = [run_start(11.0), *straggler_log()[1:]]
    assert forecast_of(forecast, last_job(other)) is None
    assert compare(forecast, tell_story(straggler_log(), gpus=3)) is None  # d predicted on GPU 3


# -- fleet report ------------------------------------------------------------------------------

SPEC = {
    "name": "pred", "data": {"source": "digits"},
    "models": [{"family": "mlp", "name": n} for n in "abcd"],
    "cluster": {"nodes": 1, "gpus_per_node": 4},
}


def run_directory(path, forecast: object | None, raw: str | None = None):
    path.mkdir()
    (path / "spec.yaml").write_text(yaml.safe_dump(SPEC))
    (path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in straggler_log()))
    if forecast is not None or raw is not None:
        (path / "forecast.json").write_text(raw if raw is not None else json.dumps(forecast))
    return path


def headings(page: str) -> list[str]:
    return re.findall(r"<h2>(.*?)</h2>", page)


def test_the_report_sets_the_predicted_gantt_above_the_measured_one(tmp_path, capsys):
    run_dir = run_directory(tmp_path / "run", STRAGGLER_FORECAST)
    report = report_run_dir(run_dir)
    page = report.path.read_text()
    assert report.figures[-1].name == "forecast-gantt.png"
    assert (run_dir / "report" / "forecast-gantt.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert 'data-file="report/forecast-gantt.png"' in page
    assert headings(page)[3:5] == ["what ran where", "predicted against measured"]
    assert "measured 20.5 s against 10.0 s predicted (2.05x)" in page
    assert "training pace: epochs took 1.25x the predicted time (most: b 2.0x)" in page
    assert report_command.run(argparse.Namespace(run_dir=str(run_dir))) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[-1].startswith("fleet: forecast: measured 20.5 s against 10.0 s predicted (2.05x); "
                                  "largest source of the error: training pace")


@pytest.mark.parametrize("raw", ["{not json", json.dumps({**STRAGGLER_FORECAST, "members": None}), None],
                         ids=["not json", "members null", "missing"])
def test_without_a_good_forecast_the_report_leaves_the_section_out(tmp_path, raw, capsys):
    run_dir = run_directory(tmp_path / "run", None, raw)
    report = report_run_dir(run_dir)
    page = report.path.read_text()
    assert "predicted against measured" not in headings(page) and report.prediction_error is None
    assert not (run_dir / "report" / "forecast-gantt.png").exists()
    assert report_command.run(argparse.Namespace(run_dir=str(run_dir))) == 0
    assert "fleet: forecast:" not in capsys.readouterr().out
