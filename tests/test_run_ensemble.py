"""`fleet ensemble` on hand-made run directories: the leaderboard's models with kept predictions
in, ensemble.json out; older runs without predictions and bad arguments are one line, exit 2."""

import json
import math

import numpy as np
import pytest

from conftest import run_fleet
from fleet.errors import UserError
from fleet.report.predictions import commit_best, write_labels
from fleet.report.results import ModelResult, RunResult, write_results
from fleet.report.run_ensemble import build_ensemble, ensemble_section, read_ensemble
from fleet.spec import parse_spec

RIGHT, WRONG = [0.9, 0.05, 0.05], [0.1, 0.9, 0.0]


def model(model_id: str, accuracy: float) -> ModelResult:
    return ModelResult(id=model_id, family="mlp", parameters=1, epochs=2, converged=True, stop_reason="max_epochs",
                       metric="val_accuracy", best_metric=accuracy, best_epoch=2, best_val_accuracy=accuracy,
                       final_train_loss=1.0, gpu_seconds=1.0)


def run_dir_of(tmp_path, test: bool = True, kept: bool = True):
    """Models a (best), b (its complement) and c (uniform, worst); predictions on 4 samples of class 0."""
    spec = parse_spec({"name": "e", "data": {"source": "digits"}, "models": [{"family": "mlp"}]})
    (tmp_path / "spec.yaml").write_text(spec.to_yaml())
    write_results(tmp_path, RunResult(name="e", policy="fleet-g", gpus=1, makespan_s=1.0, rounds=1,
                                      samples_decoded=1, overhead_s={},
                                      models=[model("c", 0.3), model("a", 0.5), model("b", 0.45)]))
    if not kept:
        return tmp_path
    probs = {"a": np.array([RIGHT, RIGHT, WRONG, WRONG]), "b": np.array([WRONG, WRONG, RIGHT, RIGHT]),
             "c": np.full((4, 3), 1 / 3)}
    labels = np.zeros(4, dtype=np.int64)
    write_labels(tmp_path, "validation", labels)
    if test:
        write_labels(tmp_path, "test", labels)
    for name, p in probs.items():
        commit_best(tmp_path, name, 2, {"val_accuracy": 0.5}, {"validation": p, **({"test": p} if test else {})}, None)
    return tmp_path


def test_the_complementary_pair_is_chosen_and_scored_against_the_best_single_model(tmp_path):
    doc = build_ensemble(run_dir_of(tmp_path), size=4)
    assert doc["candidates"] == ["a", "b", "c"] and doc["kept"] == 2
    assert doc["members"] == [{"model": "a", "count": 1, "weight": 0.5}, {"model": "b", "count": 1, "weight": 0.5}]
    assert [step["added"] for step in doc["curve"]] == ["a", "b", "a", "b"]
    assert doc["evaluated_on"] == "test" and doc["note"] == ""
    assert doc["ensemble"]["accuracy"] == 1.0 and doc["best_single"] == {**doc["best_single"], "model": "a",
                                                                          "accuracy": 0.5}
    assert doc["ensemble"]["nll"] == pytest.approx(math.log(2)) and doc["best_single"]["nll"] > math.log(2)
    assert build_ensemble(tmp_path, size=4, top=1)["members"] == [{"model": "a", "count": 1, "weight": 1.0}]


def test_without_a_test_split_it_scores_on_validation_and_says_so(tmp_path):
    doc = build_ensemble(run_dir_of(tmp_path, test=False), size=2)
    assert doc["evaluated_on"] == "validation" and "flatters" in doc["note"]


def test_the_cli_writes_ensemble_json_and_the_report_section_reads_it(tmp_path):
    run_dir_of(tmp_path)
    done = run_fleet("ensemble", str(tmp_path), "--size", "3")
    assert done.returncode == 0, done.stderr
    assert "fleet: ensemble: 2 model(s) (a 0.50, b 0.50) on test: accuracy 1.0000" in done.stdout
    doc = read_ensemble(tmp_path)
    assert doc == json.loads((tmp_path / "ensemble.json").read_text()) and doc["size"] == 3
    assert "best single (a)" in ensemble_section(doc)


@pytest.mark.parametrize("args, message", [
    (("--size", "0"), "argument --size: expected a positive integer"),
    (("--from", "-2"), "argument --from: expected a positive integer"),
    (("--size", "10001"), "--size: expected a whole number of steps from 1 to 10000"),
])
def test_bad_arguments_are_one_line_exit_2(tmp_path, args, message):
    run_dir_of(tmp_path)
    done = run_fleet("ensemble", str(tmp_path), *args)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and message in done.stderr


def test_a_run_without_saved_predictions_is_one_line_exit_2(tmp_path):
    run_dir_of(tmp_path, kept=False)
    done = run_fleet("ensemble", str(tmp_path))
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "no saved predictions (predictions/<model>/best.json)" in done.stderr
    with pytest.raises(UserError, match="no results.json"):
        build_ensemble(tmp_path / "nowhere", size=2)
