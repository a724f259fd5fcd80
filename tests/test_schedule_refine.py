"""Self-tuning rates: measurements fold into the table; a refinement is taken only when the
simulator predicts a gain larger than its cost."""

import pytest

from fleet.schedule import create_policy
from fleet.schedule.costs import Overheads
from fleet.schedule.rates import RateTable
from fleet.schedule.refine import RateRefiner, makespan_simulator, rate_changes, weigh_refinement


def table(rates: dict[str, list[float]], gpn: int = 2) -> RateTable:
    return RateTable.from_dict({
        "schema": 1, "gpus_per_node": gpn, "samples_per_epoch": 1000,
        "models": [{"id": m, "rates": {str(k + 1): r for k, r in enumerate(rs)}} for m, rs in rates.items()],
    })


def test_a_measurement_replaces_its_entry_and_scales_the_rest_of_the_model():
    profiled = table({"a": [100.0, 180.0, 250.0], "b": [50.0, 90.0, 120.0]})
    refiner = RateRefiner()
    refiner.observe("a", 2, 90.0)  # half the profiled r(2)
    proposal = refiner.propose(profiled)
    assert proposal.profile("a").rates == pytest.approx((50.0, 90.0, 125.0))
    assert proposal.profile("b").rates == profiled.profile("b").rates
    refiner.observe("a", 2, 130.0)  # averaged with the first: 110
    assert refiner.propose(profiled).rate("a", 2) == pytest.approx(110.0)
    changes = rate_changes(profiled, proposal)
    assert [(c.model, c.m) for c in changes] == [("a", 1), ("a", 2), ("a", 3)]
    assert changes[1].relative == pytest.approx(-0.5)


def test_bad_measurements_are_ignored():
    refiner = RateRefiner()
    refiner.observe("a", 1, 0.0)
    refiner.observe("a", 1, float("nan"))
    assert refiner.measured == {}


def test_small_drifts_are_not_weighed():
    profiled = table({"a": [100.0, 180.0]})
    refiner = RateRefiner()
    refiner.observe("a", 1, 104.0)
    simulate = makespan_simulator(lambda: create_policy("fleet-g"), 2)
    assert weigh_refinement(profiled, refiner.propose(profiled), [3.0], simulate, 1.0) is None


def test_a_profile_that_was_wrong_is_replanned_when_the_gain_beats_the_cost():
    """The profile says a and b train at matched rates, so FLEET-G puts them on one stream; in
    truth a is 4x slower and b waits for it. Planning on the measured rates splits them."""
    profiled = table({"a": [400.0, 700.0], "b": [400.0, 700.0], "c": [100.0, 180.0], "d": [100.0, 180.0]})
    refiner = RateRefiner()
    refiner.observe("a", 1, 100.0)
    proposal = refiner.propose(profiled)
    simulate = makespan_simulator(lambda: create_policy("fleet-g"), 4, Overheads(latency_s=0.1))
    verdict = weigh_refinement(profiled, proposal, [4.0, 4.0, 4.0, 4.0], simulate, change_cost_s=0.5)
    assert verdict is not None and verdict.gain_s > 0, verdict
    assert verdict.adopt and verdict.predicted_new_s < verdict.predicted_keep_s
    costly = weigh_refinement(profiled, proposal, [4.0] * 4, simulate, change_cost_s=verdict.gain_s + 1)
    assert costly is not None and not costly.adopt


def test_models_timed_as_one_are_measured_as_one():
    """A sweep's copies of one architecture train at one rate; their reports differ by noise.
    Pooled, they keep one rate and stay matched in FLEET-G's flotillas."""
    profiled = RateTable.from_dict({
        "schema": 1, "gpus_per_node": 2, "samples_per_epoch": 1000,
        "models": [{"id": "a", "rates": {"1": 100.0, "2": 180.0}},
                   {"id": "a-lr2", "rates": {"1": 100.0, "2": 180.0}, "timed_as": "a"},
                   {"id": "b", "rates": {"1": 100.0, "2": 180.0}}],
    })
    refiner = RateRefiner(profiled)
    refiner.observe("a-lr2", 1, 60.0)
    refiner.observe("a", 1, 80.0)  # averaged with a-lr2's report: 70
    refiner.observe("b", 1, 50.0)
    proposal = refiner.propose(profiled)
    assert proposal.profile("a").rates == proposal.profile("a-lr2").rates == pytest.approx((70.0, 126.0))
    assert proposal.profile("b").rates == pytest.approx((50.0, 90.0))
    alone = RateRefiner()  # without the table, every model is its own measurement
    alone.observe("a-lr2", 1, 60.0)
    assert alone.propose(profiled).profile("a").rates == (100.0, 180.0)
