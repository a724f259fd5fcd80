"""How a bundle trains under `runtime.fuse: auto` (issue 49), the pure part
(`fleet.schedule.bundle_ways`): the rule that keeps a way, the trial that times both ways on a
bundle's first steps, the reuse of a recorded decision, and the rates the planner then plans a
bundle at."""

import pytest

from fleet.schedule import RateTable
from fleet.schedule.bundle_ways import (
    TRIAL_ORDER,
    Way,
    WayDecision,
    WayTrial,
    decided_factors,
    kept_way,
    recorded_decision,
)
from fleet.schedule.bundling import UnitBooks
from fleet.schedule.rates import reestimated


def test_fused_is_kept_where_it_is_at_least_min_speedup_times_faster():
    assert kept_way(1.0, 2.0) is Way.FUSED
    assert kept_way(2.0, 1.0) is Way.ONE_BY_ONE
    assert kept_way(1.0, 1.0) is Way.FUSED  # as fast: fused
    assert kept_way(1.0, 1.4, min_speedup=1.5) is Way.ONE_BY_ONE
    assert kept_way(1.0, 1.5, min_speedup=1.5) is Way.FUSED
    assert kept_way(5.0, 1.0, min_speedup=0.0) is Way.FUSED  # 0: fused, whatever was measured
    assert kept_way(1.0, 100.0, min_speedup=1e9) is Way.ONE_BY_ONE


def test_a_trial_times_one_by_one_then_fused_after_a_warm_up_each_and_keeps_the_faster():
    trial = WayTrial(("a", "b"), warmup=1, steps=3)
    assert TRIAL_ORDER == (Way.ONE_BY_ONE, Way.FUSED) and trial.way is Way.ONE_BY_ONE
    assert trial.stepped(9.0, whole=True) is None  # the warm-up: not timed
    assert trial.stepped(0.1, whole=False) is None  # a part of a batch (an epoch's end): not timed
    for seconds in (0.4, 0.6, 0.5):
        assert trial.stepped(seconds, whole=True) is None
    assert trial.way is Way.FUSED and trial.times[Way.ONE_BY_ONE] == [0.4, 0.6, 0.5]
    assert trial.stepped(7.0, whole=True) is None  # the fused warm-up
    assert trial.stepped(0.2, whole=True) is None and trial.stepped(0.9, whole=True) is None
    decision = trial.stepped(0.3, whole=True)
    assert decision == WayDecision(("a", "b"), 0.3, 0.5, Way.FUSED)  # the medians


def test_a_trial_restarts_for_the_models_left_and_keeps_one_by_one_when_fused_is_slower():
    trial = WayTrial(("a", "b", "c"), warmup=0, steps=2)
    trial.stepped(1.0, True)
    trial.stepped(1.0, True)
    assert trial.way is Way.FUSED
    trial.restart(("a", "c"))  # b left: what was timed trained three models
    assert trial.way is Way.ONE_BY_ONE and trial.times == {Way.ONE_BY_ONE: [], Way.FUSED: []}
    for seconds in (0.2, 0.2, 0.3):
        assert trial.stepped(seconds, True) is None
    assert trial.stepped(0.3, True) == WayDecision(("a", "c"), 0.3, 0.2, Way.ONE_BY_ONE)


def test_a_resumed_bundle_reuses_the_newest_decision_about_all_its_models():
    old = WayDecision(("a", "b", "c", "d"), 0.4, 0.3, Way.ONE_BY_ONE)
    new = WayDecision(("a", "b", "c"), 0.2, 0.3, Way.FUSED)
    assert recorded_decision([old, new], ("a", "b")) is new
    assert recorded_decision([old, new], ("a", "d")) is old  # what is left of the first bundle
    assert recorded_decision([old, new], ("a", "e")) is None  # another bundle: timed again
    assert recorded_decision([], ("a", "b")) is None


def test_a_decision_round_trips_through_its_event_and_scales_to_what_is_left_of_its_bundle():
    decision = WayDecision(("a", "b", "c", "d"), 0.4, 0.3, Way.ONE_BY_ONE)
    assert WayDecision.from_record({"event": "bundle_decided", "time": 1.0, **decision.record()}) == decision
    assert decision.record()["kept"] == "one_by_one"
    assert decision.step_s(4) == pytest.approx(0.3) and decision.step_s(2) == pytest.approx(0.15)
    with pytest.raises(ValueError):
        WayDecision.from_record({**decision.record(), "kept": "sideways"})


def test_a_decided_bundle_is_planned_at_the_kept_way_s_measured_rate():
    rates = RateTable.from_dict({"gpus_per_node": 1, "samples_per_epoch": 100, "models": [
        {"id": "a", "rates": {"1": 100.0}}, {"id": "b", "rates": {"1": 300.0}}, {"id": "x", "rates": {"1": 50.0}}]})
    books = UnitBooks([("a", "b")])
    assert books.table(rates).rate("a+b", 1) == pytest.approx(75.0)  # the guess: a's step, then b's
    fused = WayDecision(("a", "b"), 0.1, 0.5, Way.FUSED)  # 30 samples per 0.1 s: 300 samples/s
    factors = decided_factors(rates, ("a", "b"), fused, batch_size=30)
    assert factors == {"a": pytest.approx(4.0), "b": pytest.approx(4.0)}
    planned = reestimated(rates, factors)
    assert books.table(planned).rate("a+b", 1) == pytest.approx(300.0)
    assert books.table(planned).rate("x", 1) == 50.0  # a model apart keeps its rate
    one_by_one = WayDecision(("a", "b"), 0.1, 0.5, Way.ONE_BY_ONE)  # its measured steps, not the profile's
    assert books.table(reestimated(rates, decided_factors(rates, ("a", "b"), one_by_one, 30))).rate(
        "a+b", 1) == pytest.approx(60.0)
