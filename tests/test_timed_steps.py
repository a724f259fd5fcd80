"""Rates estimated from FLOPs, corrected by a few timed steps per family (`fleet.profiling.timed_steps`)."""

import json
import math

import pytest

from fleet.errors import UserError
from fleet.profiling.document import fingerprint
from fleet.profiling.timed_steps import corrections, representatives
from fleet.runtime.control.rates_source import load_timed_steps
from fleet.runtime.control.setup import corrected_rates
from fleet.spec import parse_spec

FLOPS = {"c1": 10.0, "c2": 100.0, "c3": 1000.0, "c4": 10_000.0, "c5": 100_000.0, "r1": 50.0, "d1": 7.0}
FAMILIES = {"c1": "cnn", "c2": "cnn", "c3": "cnn", "c4": "cnn", "c5": "cnn", "r1": "resnet", "d1": "densenet"}


def test_the_smallest_middle_and_largest_of_each_family_are_timed():
    assert representatives(FLOPS, FAMILIES, sorted(FLOPS)) == ["c1", "c3", "c5", "d1", "r1"]
    # two of a family: both; of the candidates only (one per speed)
    assert representatives(FLOPS, FAMILIES, ["c2", "c4", "r1"]) == ["c2", "c4", "r1"]


def test_corrections_interpolate_in_log_flops_between_the_timed_models_of_a_family():
    estimated = {m: 1e6 / f for m, f in FLOPS.items()}
    # the smallest cnn ran at a quarter of its estimate, the middle one at half, the largest as estimated
    measured = {"c1": estimated["c1"] / 4, "c3": estimated["c3"] / 2, "c5": estimated["c5"], "r1": estimated["r1"] / 3}
    factors = corrections(estimated, measured, FLOPS, FAMILIES)
    assert factors["c1"] == pytest.approx(0.25) and factors["c3"] == pytest.approx(0.5)
    assert factors["c2"] == pytest.approx(math.sqrt(0.25 * 0.5))  # halfway in log FLOPs, geometric
    assert factors["c4"] == pytest.approx(math.sqrt(0.5))
    assert factors["r1"] == pytest.approx(1 / 3)
    # a family none was timed of takes the median correction of all timed models
    assert factors["d1"] == pytest.approx(math.sqrt(1 / 3 * 0.5))  # the middle two of 1/4, 1/3, 1/2, 1
    assert corrections(estimated, {}, FLOPS, FAMILIES) == {m: 1.0 for m in FLOPS}


def test_steps_json_is_reused_for_its_ensemble_only_and_checked(tmp_path):
    spec = parse_spec({"name": "t", "data": {"source": "digits"}, "models": [{"family": "mlp"}]})
    path = tmp_path / "steps.json"
    assert load_timed_steps(tmp_path, spec) is None
    good = {"fingerprint": fingerprint(spec), "rates": {"mlp-000": 900.0}, "preprocessing": {}, "hardware": {}}
    path.write_text(json.dumps(good))
    assert load_timed_steps(tmp_path, spec)["rates"] == {"mlp-000": 900.0}
    path.write_text(json.dumps({**good, "fingerprint": "another ensemble"}))
    assert load_timed_steps(tmp_path, spec) is None  # timed again
    for bad, field in [({**good, "rates": {"mlp-000": -1}}, "rates"), ({**good, "rates": {"other": 5.0}}, "rates"),
                       ({**good, "hardware": []}, "hardware")]:
        path.write_text(json.dumps(bad))
        with pytest.raises(UserError, match=f"steps.json: {field}"):
            load_timed_steps(tmp_path, spec)
    path.write_text("{")
    with pytest.raises(UserError, match="steps.json: cannot read it"):
        load_timed_steps(tmp_path, spec)


def test_the_timed_saves_and_validation_passes_go_with_the_corrected_rates():
    spec = parse_spec({"name": "t", "data": {"source": "digits"},
                       "models": [{"family": "mlp"}, {"family": "mlp", "params": {"hidden": [64, 64]}},
                                  {"family": "mlp", "train": {"lr": 0.5}}]})
    first, second, sibling = (m.id for m in spec.models)
    steps = {"fingerprint": fingerprint(spec), "rates": {first: 900.0}, "checkpoint_s": {first: 0.01},
             "eval_rate": {first: 2700.0, second: "fast"}, "preprocessing": {}, "hardware": {}}
    table = corrected_rates(spec, 1000, steps)
    assert table.profile(first).extra["eval_rate"] == 2700.0 and table.profile(first).extra["checkpoint_s"] == 0.01
    assert "eval_rate" not in table.profile(second).extra  # not a number: left out, its end taken from the timed
    # a model that differs from a timed one only in its learning rate takes its figures (its rates too)
    assert table.profile(sibling).extra["eval_rate"] == 2700.0 and table.profile(sibling).extra["checkpoint_s"] == 0.01
    assert table.profile(sibling).rates == table.profile(first).rates
    # an older steps.json (no validation timed) still corrects the rates
    older = corrected_rates(spec, 1000, {k: v for k, v in steps.items() if k != "eval_rate"})
    assert older.rate(first, 1) == table.rate(first, 1) and "eval_rate" not in older.profile(first).extra
