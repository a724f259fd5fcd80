"""What a run with early stopping shows: each model's end in results.json, leaderboard.csv and
the page's leaderboard; rungs filling in `fleet status`; the rung chart, the learning curves
with stop marks and the model-epochs saved in `fleet report`. Run directories are synthetic:
the events, rung records and results a run writes, as docs/run-directory.md gives them."""

from __future__ import annotations

import csv
import json
import re
from dataclasses import asdict

import pytest
import yaml

from fleet.commands.report import report_run_dir
from fleet.report import html_page
from fleet.report.results import (
    LEADERBOARD_COLUMNS, ModelResult, RunResult, epochs_saved, model_end, read_results, write_results,
)
from fleet.report.rungs import rung_arrivals, rung_records
from fleet.report.run_report import _forecast_rows
from fleet.report.run_story import tell_story
from fleet.report.standings import standings
from fleet.spec import parse_spec


def result(model_id: str, epochs: int, converged: bool, reason: str | None, rung: int | None = None,
           best: float | None = 0.5) -> ModelResult:
    history = [{"epoch": k, "train_loss": 1.0 / k, "val_accuracy": 0.1 * k, "val_loss": 1.0 / k}
               for k in range(1, epochs + 1)]
    return ModelResult(model_id, "mlp", 10, epochs, converged, reason, "val_accuracy", best, epochs, best, 0.1, 2.0,
                       history, rung)


ENDS = [
    (result("p", 4, True, "patience"), "converged (patience)"),
    (result("t", 2, True, "target"), "converged (target)"),
    (result("m", 8, True, "max_epochs"), "converged (max_epochs)"),
    (result("r0", 1, True, "early_stop", rung=0), "stopped at rung 1 (1 epoch)"),
    (result("r1", 3, True, "early_stop", rung=1), "stopped at rung 2 (3 epochs)"),
    (result("d", 2, True, "diverged", best=None), "diverged"),
    (result("n", 5, False, None), "not finished"),
]


@pytest.mark.parametrize(("model", "end"), ENDS, ids=[m.id for m, _ in ENDS])
def test_each_model_gets_its_end(model, end):
    assert model_end(model) == end


def test_the_leaderboard_keeps_its_columns_and_adds_new_ones_last(tmp_path):
    models = [m for m, _ in ENDS]
    write_results(tmp_path, RunResult("t", "fleet-g", 2, 1.0, 1, 0, {}, models,
                                      early_stop={"method": "asha", "reduction": 3}))
    rows = list(csv.DictReader((tmp_path / "leaderboard.csv").read_text().splitlines()))
    assert tuple(rows[0]) == LEADERBOARD_COLUMNS and LEADERBOARD_COLUMNS[13:] == ("end", "group", "group_rank")
    assert LEADERBOARD_COLUMNS[:13] == (
        "rank", "id", "family", "metric", "best_metric", "best_epoch", "best_val_accuracy",
        "epochs", "converged", "stop_reason", "final_train_loss", "parameters", "gpu_seconds")
    assert {r["id"]: r["end"] for r in rows} == {m.id: end for m, end in ENDS}
    assert rows[-1]["id"] == "d"  # no best metric: last
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["early_stop"] == {"method": "asha", "reduction": 3}
    assert {m["id"]: m["rung"] for m in doc["models"]}["r1"] == 1
    assert read_results(tmp_path) == RunResult.from_dict(doc)
    assert read_results(tmp_path).models[4] == ENDS[4][0]


def test_an_older_results_json_reads_without_rung_or_early_stop(tmp_path):
    doc = asdict(RunResult("t", "fleet-g", 2, 1.0, 1, 0, {}, [result("a", 2, True, "max_epochs")]))
    del doc["early_stop"]
    del doc["models"][0]["rung"]
    doc["models"][0]["written_by_a_later_fleet"] = 1
    (tmp_path / "results.json").write_text(json.dumps(doc))
    old = read_results(tmp_path)
    assert old.early_stop == {} and old.models[0].rung is None and old.models[0].epochs == 2
    assert model_end(old.models[0]) == "converged (max_epochs)"


def test_the_pages_leaderboard_shows_each_models_end():
    text = html_page.leaderboard_table([m for m, _ in ENDS])
    assert "<th>end</th>" in text
    for _, end in ENDS:
        assert f">{end}</td>" in text


SPEC = {
    "name": "es", "data": {"source": "digits"},
    "models": [{"family": "mlp", "name": n, "train": {"max_epochs": 9}} for n in ("a", "b", "c", "d")],
    "cluster": {"nodes": 1, "gpus_per_node": 2},
}


def event(kind: str, when: float, **fields) -> dict:
    """A record of events.jsonl, `when` seconds after the run started."""
    return {"event": kind, "time": 1000.0 + when, **fields}


def epoch(at: float, model: str, number: int, accuracy: float) -> dict:
    return event("epoch", at, model=model, epoch=number, train_loss=1.0 / number, val_accuracy=accuracy,
                 val_loss=1.0 - accuracy, samples=10, epoch_s=1.0, samples_per_s=10.0, stream_samples_per_s=10.0)


def rung(when: float, model: str, epochs: int, index: int, verdict: str, seq: int) -> dict:
    """A rung decision as events.jsonl has it (rungs.jsonl: the same fields but ``event`` and ``time``)."""
    return event("rung", when, model=model, rung=epochs, index=index, verdict=verdict, metric=-0.5, cutoff=None,
                 bracket=0, seq=seq, at=when)


def test_standings_take_the_rung_from_an_early_stopped_models_converged_event():
    log = [event("run_start", 0.0, early_stop={"method": "asha", "max_epochs": 9, "min_epochs": 1, "reduction": 3}),
           event("member_start", 0.0, model="a", gpus=[0]), event("member_start", 0.0, model="b", gpus=[1]),
           epoch(1.0, "a", 1, 0.2), epoch(1.0, "b", 1, 0.6),
           event("converged", 1.0, model="a", reason="early_stop", rung=0),
           event("member_left", 1.1, model="a", converged=True, parameters=5),
           event("converged", 1.5, model="b", reason="diverged")]
    spec = parse_spec(SPEC, check_paths=False)
    rows = {m.id: m for m in standings(log, spec.models, tell_story(log, gpus=2))}
    assert (rows["a"].rung, rows["a"].stop_reason, rows["a"].converged) == (0, "early_stop", True)
    assert model_end(rows["a"]) == "stopped at rung 1 (1 epoch)"
    assert (rows["b"].rung, model_end(rows["b"])) == (None, "diverged")
    assert (rows["c"].rung, model_end(rows["c"])) == (None, "not finished")


# -- fleet report: a synthetic run directory ----------------------------------------------------

ASHA = {"method": "asha", "max_epochs": 9, "min_epochs": 1, "reduction": 3, "brackets": None, "grace_epochs": 1,
        "min_models": 5}  # rungs at epochs 1 and 3


def stint(start: float, model: str, gpu: int, accuracies: list[float], first: int = 1) -> list[dict]:
    """`model` on `gpu` from `start`, an epoch a second with these validation accuracies."""
    return [event("member_start", start, model=model, gpus=[gpu], stream=0),
            *(epoch(start + k + 1, model, first + k, a) for k, a in enumerate(accuracies))]


def asha_log(early: bool) -> list[dict]:
    """a trains to its patience (epoch 5); b is stopped at rung 1 (epoch 1), c at rung 2 (epoch
    3); d never starts. Without `early`, the same run with neither setting nor rung decisions."""
    ended = {"reason": "early_stop"} if early else {"reason": "max_epochs"}
    log = [event("run_start", 0.0, policy="fleet-g", **({"early_stop": ASHA} if early else {})),
           event("round_start", 0.0, index=0),
           *stint(0.0, "a", 0, [0.6, 0.7, 0.8, 0.8, 0.8]), *stint(0.2, "b", 1, [0.3]),
           rung(1.0, "a", 1, 0, "continue", 0), rung(1.2, "b", 1, 0, "stopped", 1),
           event("converged", 1.2, model="b", **ended, rung=0),
           event("member_left", 1.3, model="b", converged=True, parameters=5),
           *stint(1.3, "c", 1, [0.5, 0.5, 0.4]), rung(2.3, "c", 1, 0, "continue", 2),
           rung(3.0, "a", 3, 1, "continue", 3), rung(4.3, "c", 3, 1, "stopped", 4),
           event("converged", 4.3, model="c", **ended, rung=1),
           event("member_left", 4.4, model="c", converged=True, parameters=5),
           event("converged", 5.0, model="a", reason="patience"),
           event("member_left", 5.1, model="a", converged=True, parameters=5),
           event("run_end", 5.2, makespan=5.2, rounds=1, interrupted=False)]
    return log if early else [e for e in log if e["event"] != "rung"]


def run_directory(path, log: list[dict]):
    spec = {**SPEC, "models": [*SPEC["models"][:2], {"family": "mlp", "name": "c", "train": {"max_epochs": 6}},
                               SPEC["models"][3]]}
    path.mkdir()
    (path / "spec.yaml").write_text(yaml.safe_dump(spec))
    (path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in log))
    return path


def headings(page: str) -> list[str]:
    return re.findall(r"<h2>(.*?)</h2>", page)


OLD_FIGURES = ["curves.png", "curves-by-family.png", "gantt.png", "planned-gantt.png", "gpu-use.png", "decoded.png"]


def test_the_report_draws_rungs_and_stops_and_counts_the_epochs_saved(tmp_path):
    report = report_run_dir(run_directory(tmp_path / "run", asha_log(early=True)))
    page = report.path.read_text()
    added = ["rungs.png", "curves-stopped.png"]
    assert [f.name for f in report.figures] == OLD_FIGURES + added
    for name in added:
        assert (tmp_path / "run" / "report" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f'data-file="report/{name}"' in page
    assert headings(page)[:4] == ["summary", "leaderboard (click a column to sort)", "learning curves", "early stopping"]
    # a 5 + b 1 + c 3 epochs; saved: b 9 - 1, c 6 - 3 (its own max_epochs); d never ran, a ended on its own
    assert "<td>model-epochs trained: 9; saved by early stopping: at most 11</td>" in page
    assert "<td>2 of 4 models, at a rung</td>" in page
    ends = {m.id: model_end(m) for m in report.models}
    assert ends == {"a": "converged (patience)", "b": "stopped at rung 1 (1 epoch)",
                    "c": "stopped at rung 2 (3 epochs)", "d": "not finished"}


def test_the_rung_chart_counts_each_model_once_per_rung_from_its_first_decision():
    records = rung_records([*asha_log(early=True), rung(1.0, "a", 1, 0, "continue", 0),  # a record read twice
                            rung(6.0, "a", 3, 1, "promoted", 5)])  # a later verdict at a rung it reached
    assert rung_arrivals(records) == {1: [1.0, 1.2, 2.3], 3: [3.0, 4.3]}
    assert rung_arrivals([{**r, "at": None} for r in records]) == {}


def test_epochs_saved_count_only_models_early_stopping_stopped():
    models = [m for m, _ in ENDS]
    assert epochs_saved(models, {m.id: 9 for m in models}) == (9 - 1) + (9 - 3)
    assert epochs_saved(models, {"r0": 1}) == 0 + 0  # r1 missing from the spec: nothing claimed


def test_without_early_stopping_the_report_is_unchanged(tmp_path):
    report = report_run_dir(run_directory(tmp_path / "run", asha_log(early=False)))
    page = report.path.read_text()
    assert [f.name for f in report.figures] == OLD_FIGURES
    assert sorted(p.name for p in (tmp_path / "run" / "report").iterdir()) == sorted(OLD_FIGURES)
    assert headings(page) == ["summary", "leaderboard (click a column to sort)", "learning curves", "what ran where",
                              "cpu slot use", "decoding"]
    assert "early stop" not in page and "model-epochs" not in page and "rung" not in page


def test_the_summary_sets_the_jobs_forecast_beside_its_measured_makespan():
    forecast = {"policy": "fleet-g", "makespan_s": 10.0, "range_s": [10.5, 13.0], "rate_spread": 0.1, "draws": 8}
    story = type("Story", (), {"jobs": [object()], "state": "finished", "training_s": 24.0})()
    rows = _forecast_rows([{"event": "run_start", "forecast": forecast}], story)
    assert rows == [("the job's forecast", "10.0 s by fleet-g (10-90 %: 10.5-13.0 s, rates within ±10 %; start-up, "
                     "validation and shared cores not modelled); measured / forecast: 2.40")]
    story.jobs = [object(), object()]  # resumed: the last job forecast only the work left to it
    assert "measured" not in _forecast_rows([{"event": "run_start", "forecast": forecast}], story)[0][1]
    assert _forecast_rows([{"event": "run_start"}], story) == []
