"""Ensembles per group (issue 47) on hand-made run directories: with `data.group_by`, `fleet
ensemble` chooses one ensemble per group from that group's models, on the group's own
validation labels, scored on its test split; ensemble.json keyed by group, the report's table,
and `fleet predict`'s --group."""

import json

import numpy as np
import pytest

from conftest import run_fleet
from fleet.errors import UserError
from fleet.report.predictions import commit_best, labels_path, write_labels
from fleet.report.results import ModelResult, RunResult, write_results
from fleet.report.run_ensemble import build_ensemble, ensemble_section
from fleet.runtime.train.inference import chosen_models
from fleet.spec import parse_spec

RIGHT, WRONG, FLAT = [0.9, 0.05, 0.05], [0.1, 0.9, 0.0], [1 / 3] * 3
# group "X 1" (id part x-1): 4 samples; a-x-1 right on the first two, b-x-1 on the last two.
# group "y" (id part y): 3 samples; a-y and b-y both right on all, a-y less sure; c-y kept nothing.
PREDICTIONS = {"a-x-1": [RIGHT, RIGHT, WRONG, WRONG], "b-x-1": [WRONG, WRONG, RIGHT, RIGHT],
               "c-x-1": [FLAT] * 4, "a-y": [[0.6, 0.2, 0.2]] * 3, "b-y": [RIGHT] * 3}
GROUPS = {"a-x-1": "X 1", "b-x-1": "X 1", "c-x-1": "X 1", "a-y": "y", "b-y": "y", "c-y": "y"}
ACCURACY = {"a-x-1": 0.5, "b-x-1": 0.45, "c-x-1": 0.3, "a-y": 0.9, "b-y": 0.8, "c-y": 0.7}


def model(model_id: str) -> ModelResult:
    samples = 40 if GROUPS[model_id] == "X 1" else 30
    return ModelResult(model_id, "mlp", 1, 2, True, "max_epochs", "val_accuracy", ACCURACY[model_id], 2,
                       ACCURACY[model_id], 1.0, 1.0, [{"epoch": 2, "samples": samples, "val_samples": 4}])


def grouped_run_dir(tmp_path, test: bool = True):
    spec = parse_spec({"name": "e", "data": {"source": "digits"}, "models": [{"family": "mlp"}]})
    (tmp_path / "spec.yaml").write_text(spec.to_yaml())
    write_results(tmp_path, RunResult("e", "grouped", 2, 1.0, 1, 1, {}, [model(m) for m in GROUPS], groups=GROUPS))
    for part, count in (("x-1", 4), ("y", 3)):
        write_labels(tmp_path, "validation", np.zeros(count, np.int64), part)
        if test:
            write_labels(tmp_path, "test", np.zeros(count, np.int64), part)
    for name, probs in PREDICTIONS.items():
        p = np.array(probs)
        commit_best(tmp_path, name, 2, {"val_accuracy": 0.5}, {"validation": p, **({"test": p} if test else {})}, None)
    return tmp_path


def test_each_group_gets_its_own_ensemble_of_its_own_models(tmp_path):
    doc = build_ensemble(grouped_run_dir(tmp_path), size=4)
    assert list(doc["groups"]) == ["X 1", "y"]  # the largest group first
    x, y = doc["groups"]["X 1"], doc["groups"]["y"]
    assert x["candidates"] == ["a-x-1", "b-x-1", "c-x-1"] and y["candidates"] == ["a-y", "b-y"]
    assert y["left_out"] == ["c-y"] and doc["left_out_groups"] == []
    assert [m["model"] for m in x["members"]] == ["a-x-1", "b-x-1"] and x["ensemble"]["accuracy"] == 1.0
    assert x["ensemble"]["samples"] == 4 and y["ensemble"]["samples"] == 3  # each on its own group's split
    assert x["group"] == "X 1" and x["evaluated_on"] == "test" and x["best_single"]["model"] == "a-x-1"
    assert doc["ensemble"]["samples"] == 7 and doc["ensemble"]["accuracy"] == pytest.approx(1.0)
    assert doc["best_single"]["accuracy"] == pytest.approx((4 * 0.5 + 3 * 1.0) / 7)  # pooled over the groups
    assert labels_path(tmp_path, "test", "x-1").name == "labels-test-x-1.npy"
    section = ensemble_section(doc)
    assert "one per group: 2 group(s)" in section and section.count("<tr>") == 3 + 3  # 3 notes, header, 2 groups
    only = build_ensemble(tmp_path, size=4, top=1)["groups"]
    assert [m["model"] for g in only.values() for m in g["members"]] == ["a-x-1", "a-y"]  # each group's best


def test_a_group_without_kept_predictions_is_left_out_and_none_at_all_is_one_line(tmp_path):
    run_dir = grouped_run_dir(tmp_path)
    for name in ("a-y", "b-y"):
        (run_dir / "predictions" / name / "best.json").unlink()
    doc = build_ensemble(run_dir, size=2)
    assert list(doc["groups"]) == ["X 1"] and doc["left_out_groups"] == ["y"]
    for name in ("a-x-1", "b-x-1", "c-x-1"):
        (run_dir / "predictions" / name / "best.json").unlink()
    with pytest.raises(UserError, match="no saved predictions of any group"):
        build_ensemble(run_dir, size=2)


def test_the_cli_says_one_line_per_group_run_and_predict_needs_a_group(tmp_path):
    grouped_run_dir(tmp_path, test=False)
    done = run_fleet("ensemble", str(tmp_path), "--size", "3")
    assert done.returncode == 0, done.stderr
    assert "fleet: ensemble: one per group, 2 group(s), on validation: accuracy 1.0000" in done.stdout
    assert "flatters" in done.stdout  # no test split: scored on what it was chosen on, and said
    assert set(json.loads((tmp_path / "ensemble.json").read_text())["groups"]) == {"X 1", "y"}
    with pytest.raises(UserError, match=r"one ensemble per group \(data.group_by\): name one with --group KEY"):
        chosen_models(tmp_path, None)
    with pytest.raises(UserError, match="^--group: 'z' has no ensemble in"):
        chosen_models(tmp_path, None, "z")
    weights = chosen_models(tmp_path, None, "y")
    assert set(weights) <= {"a-y", "b-y"} and sum(weights.values()) == pytest.approx(1.0)  # of group y only
    done = run_fleet("predict", str(tmp_path), "--data", str(tmp_path / "spec.yaml"))
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "--group KEY" in done.stderr
