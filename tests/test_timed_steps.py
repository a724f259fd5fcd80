"""Rates estimated from FLOPs, corrected by a few timed steps per family (`fleet.profiling.timed_steps`)."""

import json
import math

import pytest

from fleet.errors import UserError
from fleet.profiling.document import fingerprint
from fleet.profiling.timed_steps import (corrections, group_costs, group_counts, group_rates, group_representatives,
                                         representatives)
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
    path.write_text(json.dumps({**good, "group_steps": {"mlp-000": {"1": 0.01, "2": 0.012}}}))
    assert load_timed_steps(tmp_path, spec)["group_steps"] == {"mlp-000": {"1": 0.01, "2": 0.012}}
    for bad, field in [({**good, "rates": {"mlp-000": -1}}, "rates"), ({**good, "rates": {"other": 5.0}}, "rates"),
                       ({**good, "hardware": []}, "hardware"), ({**good, "group_steps": [1]}, "group_steps"),
                       ({**good, "group_steps": {"other": {"1": 0.01}}}, "group_steps.other"),
                       ({**good, "group_steps": {"mlp-000": {"two": 0.01}}}, "group_steps.mlp-000"),
                       ({**good, "group_steps": {"mlp-000": {"0": 0.01}}}, "group_steps.mlp-000"),
                       ({**good, "group_steps": {"mlp-000": {"2": -0.5}}}, "group_steps.mlp-000")]:
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


def test_groups_are_timed_on_the_models_of_fewest_and_most_parameter_bytes_up_to_a_node():
    param_bytes = {"a": 4_000, "b": 400_000, "c": 40_000}
    assert group_representatives(param_bytes, ["c", "a", "b"]) == ["a", "b"]
    assert group_representatives(param_bytes, ["c"]) == ["c"]
    assert group_representatives(param_bytes, []) == []
    assert group_counts(4, 16) == [2, 3, 4]  # a node's trainers: Eq. 5 goes on from there
    assert group_counts(4, 3) == [2, 3]
    assert group_counts(1, 8) == []  # no group within a node


def test_a_groups_added_seconds_per_step_are_a_line_in_parameter_bytes():
    # a: 1 MB, b: 11 MB; on 2 trainers a step takes 10 ms more for a, 30 ms more for b
    steps = {"a": {1: 0.020, 2: 0.030, 3: 0.045}, "b": {1: 0.100, 2: 0.130, 3: 0.115}}
    costs = group_costs(steps, {"a": 1_000_000, "b": 11_000_000})
    assert [c.m for c in costs] == [2, 3]
    two, three = costs
    assert two.per_byte_s == pytest.approx(0.02 / 10e6) and two.fixed_s == pytest.approx(0.008)
    assert two.seconds(6_000_000) == pytest.approx(0.020)
    # on 3 trainers b added less than a: no negative slope, the mean of the two as fixed
    assert three.per_byte_s == 0 and three.fixed_s == pytest.approx((0.025 + 0.015) / 2)
    # a group slower per step than the profile's one trainer by nothing: no negative cost
    assert group_costs({"a": {1: 0.05, 2: 0.04}}, {"a": 10})[0].fixed_s == 0
    # a model of 6 MB, 1,000 samples/s alone at batch 32: 32 ms a step, 20 ms more on 2 trainers
    rates = group_rates(1000.0, 32, 6_000_000, costs)
    assert rates[2] == pytest.approx(2 * 32 / (0.032 + 0.020))
    assert set(rates) == {2, 3}


def test_timed_groups_replace_the_assumed_scaling_up_to_a_node_and_eq5_goes_on_beyond():
    spec = parse_spec({"name": "t", "data": {"source": "digits"},
                       "models": [{"family": "mlp"}, {"family": "mlp", "params": {"hidden": [256, 256]}}],
                       "cluster": {"nodes": 2, "gpus_per_node": 3}})
    small, large = (m.id for m in spec.models)
    steps = {"fingerprint": fingerprint(spec), "rates": {small: 2000.0, large: 500.0}, "preprocessing": {},
             "hardware": {}}
    assumed = corrected_rates(spec, 1000, steps)
    assert assumed.rate(small, 2) == pytest.approx(2000.0 * 2**0.9)  # no timed groups: r(1) m^0.9
    batch = spec.model(small).train.batch_size
    timed = {**steps, "group_steps": {small: {"1": batch / 2000.0, "2": batch / 2000.0 + 0.01,
                                              "3": batch / 2000.0 + 0.02},
                                      large: {"1": batch / 500.0, "2": batch / 500.0 + 0.01}}}
    table = corrected_rates(spec, 1000, timed)
    assert table.rate(small, 2) == pytest.approx(2 * batch / (batch / 2000.0 + 0.01))
    assert table.rate(large, 2) == pytest.approx(2 * batch / (batch / 500.0 + 0.01))
    assert table.rate(small, 3) == pytest.approx(3 * batch / (batch / 2000.0 + 0.02))
    assert table.rate(small, 6) < 6 * table.rate(small, 3) / 3  # Eq. 5 beyond the node, from 2-3 trainers
