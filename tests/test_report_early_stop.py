"""What a run with early stopping shows: each model's end in results.json, leaderboard.csv and
the page's leaderboard; rungs filling in `fleet status`; the rung chart, the learning curves
with stop marks and the model-epochs saved in `fleet report`. Run directories are synthetic:
the events, rung records and results a run writes, as docs/run-directory.md gives them."""

from __future__ import annotations

import csv
import json
from dataclasses import asdict

import pytest

from fleet.report import html_page
from fleet.report.results import (
    LEADERBOARD_COLUMNS, ModelResult, RunResult, leaderboard_csv, model_end, read_results, write_results,
)
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


def test_the_leaderboard_keeps_its_columns_and_adds_the_end_last(tmp_path):
    models = [m for m, _ in ENDS]
    write_results(tmp_path, RunResult("t", "fleet-g", 2, 1.0, 1, 0, {}, models,
                                      early_stop={"method": "asha", "reduction": 3}))
    rows = list(csv.DictReader((tmp_path / "leaderboard.csv").read_text().splitlines()))
    assert tuple(rows[0]) == LEADERBOARD_COLUMNS and LEADERBOARD_COLUMNS[-1] == "end"
    assert LEADERBOARD_COLUMNS[:-1] == (
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
