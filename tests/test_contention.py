"""The contention probe's figures (`fleet.profiling.contention`), checked by hand."""

import math

import pytest

from fleet.profiling import contention


def test_the_slope_is_the_growth_of_cpu_time_per_unit_of_load_per_core_above_one():
    # alone 1.2 times the median rate beside the others, at 2 trainers per core: 0.2 per unit
    assert contention.slope(1200.0, [1000.0, 990.0, 1100.0], 2.0) == pytest.approx(0.2)
    assert contention.slope(1200.0, [1000.0], 3.0) == pytest.approx(0.1)
    assert contention.slope(900.0, [1000.0], 2.0) == 0.0  # faster beside the others: noise, no growth
    assert contention.slope(9000.0, [1000.0], 2.0) == contention.MAX_SLOPE
    # a load that hardly switches threads, or a rate missing, tells nothing
    assert contention.slope(1200.0, [1000.0], 1.0) is None
    assert contention.slope(1200.0, [], 2.0) is None
    assert contention.slope(math.nan, [1000.0], 2.0) is None


def test_the_record_keeps_what_was_timed_and_reads_back_only_sound_figures():
    block = contention.record("m", 1200.0, [1000.0, 1000.0], 2.0)
    assert block == {"model": "m", "load": 2.0, "alone_rate": 1200.0, "beside_rates": [1000.0, 1000.0], "slope": 0.2}
    assert contention.read({"contention": block}) == (0.2, 2.0)
    assert "slope" not in contention.record("m", 1200.0, [1000.0], 1.0)
    # a hand-edited or foreign profile: anything odd reads as not measured
    for odd in ({"slope": "0.2", "load": 2.0}, {"slope": True, "load": 2.0}, {"slope": -0.1, "load": 2.0},
                {"slope": 5.0, "load": 2.0}, {"slope": 0.2, "load": 0.5}, {"slope": 0.2, "load": math.inf},
                {"slope": math.nan, "load": 2.0}, {"slope": 0.2}, [], "x"):
        assert contention.read({"contention": odd}) is None, odd
    assert contention.read({}) is None and contention.read(None) is None


def test_the_probe_times_the_median_model_on_the_machine_with_the_most_trainers():
    assert contention.probe_model({"a": 100.0, "b": 300.0, "c": 200.0}) == "c"
    assert contention.probe_model({"a": 100.0, "bad": -1.0}) == "a"
    assert contention.probe_model({}) is None
    assert contention.busiest_host(["n1", "n2", "n2", "n1", "n2"]) == [1, 2, 4]
    assert contention.busiest_host([]) == []
    assert contention.probe_load(4, 1, 2.0) == 2.0
    assert contention.probe_load(2, 8, 4.0) == 2.0  # a trainer uses at most the machine's cores


def test_the_probe_times_a_fast_model_for_long_enough_to_see_its_turns_on_the_cores():
    assert contention.probe_steps(1000.0, 32, 20) == 20  # 20 steps of 32 take 0.64 s
    assert contention.probe_steps(9600.0, 32, 20) == 150  # 0.5 s at 9,600/s
    assert contention.probe_steps(float("nan"), 32, 20) == 20
