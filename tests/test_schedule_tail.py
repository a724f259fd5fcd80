"""fleet-adaptive's tail (planners/_tail.py) by hand, and the policy's invariants under re-planning."""

import numpy as np
import pytest

from fleet.schedule import Overheads, create_policy, noisy_scenario, paper100, simulate
from fleet.schedule.planners._tail import Running, common_goal, finish_curves, grow_into_free, rebalance
from fleet.schedule.simulator import Outcome

LINEAR = np.array([10.0, 20.0, 30.0, 40.0])  # r(m) = 10 m


def running(model, gpus, remaining, now=0.0, switch=0.0, rates=LINEAR):
    return Running(model, gpus, now + remaining / rates[gpus - 1], remaining, switch, rates)


def test_finish_curves_charge_the_switch_and_never_rise():
    curves = finish_curves(0.0, [running("a", 2, 1200.0, switch=5.0, rates=np.array([10.0, 20.0, 15.0]))], 4)
    # 1 GPU: 5 + 120; 2 GPUs: where it is, 60; 3 GPUs: slower than 2; 4: not profiled
    assert curves.tolist() == [[125.0, 60.0, 60.0, 60.0]]


def test_the_common_goal_is_what_the_gpus_can_pay_for():
    curves = finish_curves(0.0, [running("a", 1, 1200.0), running("b", 1, 1200.0)], 4)
    assert common_goal(curves, 2) == 120.0
    assert common_goal(curves, 3) == 120.0  # one more GPU: one model faster, not both
    assert common_goal(curves, 4) == 60.0


def test_free_gpus_go_to_the_model_predicted_last():
    late, early = running("late", 1, 2400.0), running("early", 1, 600.0)
    assert rebalance(0.0, [late, early], free=2, margin=2.0) == {"late": 3}  # 240 s -> 80 s, "early" at 60 s


def test_models_far_ahead_give_gpus_up_to_the_last_one():
    late, early = running("late", 1, 2400.0), running("early", 3, 600.0)  # 240 s and 20 s
    assert rebalance(0.0, [late, early], free=0, margin=2.0) == {"late": 3, "early": 1}


def test_without_shrinking_only_the_free_gpus_are_shared_out():
    late, early = running("late", 1, 2400.0), running("early", 3, 600.0)
    assert rebalance(0.0, [late, early], free=0, margin=2.0, shrink=False) == {}
    assert rebalance(0.0, [late, early], free=1, margin=2.0, shrink=False) == {"late": 2}
    other = running("other", 1, 1800.0)  # 180 s: the two late ones share 3 free GPUs, 80 s and 90 s
    assert rebalance(0.0, [late, early, other], free=3, margin=2.0, shrink=False) == {"late": 3, "other": 2}


def test_nothing_moves_for_a_gain_below_the_switch_cost_or_the_gain_share():
    late, early = running("late", 1, 2400.0, switch=60.0), running("early", 1, 600.0, switch=60.0)
    assert rebalance(0.0, [late, early], free=2, margin=2.0) == {}  # 240 -> 60 + 80 s: less than 2 x 60 s
    late, early = running("late", 1, 2400.0), running("early", 1, 600.0)
    assert rebalance(0.0, [late, early], free=2, margin=2.0, gain=0.7) == {}  # 240 -> 80 s: 67 % of 240 s
    assert rebalance(0.0, [], free=4, margin=2.0) == {}


def test_a_last_model_at_its_fastest_count_does_not_hold_free_gpus_back():
    # "last" is on its fastest count (its rates stop at 2 GPUs): 200 s, no GPU makes it faster,
    # so rebalance moves nothing; "next" (150 s on 1 GPU) still gains from 2 free GPUs: 50 s
    last = running("last", 2, 4000.0, rates=np.array([10.0, 20.0]))
    nxt = running("next", 1, 1500.0)
    assert rebalance(0.0, [last, nxt], free=2, margin=2.0, shrink=False) == {}
    assert grow_into_free(0.0, [last, nxt], free=2, margin=2.0) == {"next": 3}
    assert grow_into_free(0.0, [last, nxt], free=0, margin=2.0) == {}


def test_free_gpus_go_past_a_last_model_whose_gain_is_below_the_gate():
    # "last" (200 s) would finish 3 s earlier on its one useful GPU more, switch included: below
    # the gate of 2 x 15 s; "next" goes from 150 s to 15 + 50 s on 3 GPUs
    last = running("last", 1, 2000.0, switch=15.0, rates=np.array([10.0, 11.0]))
    nxt = running("next", 1, 1500.0, switch=15.0)
    assert rebalance(0.0, [last, nxt], free=2, margin=2.0, shrink=False) == {}
    assert grow_into_free(0.0, [last, nxt], free=2, margin=2.0) == {"next": 3}
    # where no model gains enough, nothing moves
    assert grow_into_free(0.0, [last, running("flat", 1, 100.0, switch=15.0)], free=2, margin=2.0) == {}


@pytest.mark.parametrize("noise_model", ["uniform", "stop-rule"])
@pytest.mark.parametrize("gpus", [6, 40])
def test_fleet_adaptive_invariants_under_re_planning(noise_model, gpus):
    """With wrong estimates the policy re-plans (checkpoints and relaunches models) and still
    trains every model to its true epochs exactly once, never holds a GPU twice, and decides
    the same for the same events."""
    workload = paper100(seed=5, models=24)
    scen = noisy_scenario(workload, gpus, 5, 0.3, noise_model)
    results = [simulate(create_policy("fleet-adaptive", seed=5), scen, Overheads()) for _ in range(2)]
    result = results[0]
    assert result.checkpoints > 0  # it did re-plan: models were resized in the tail
    assert results[1].makespan == result.makespan and results[1].timeline == result.timeline
    converged = sorted(m.model for m in result.timeline.members if m.outcome is Outcome.CONVERGED)
    assert converged == sorted(scen.rates.ids)
    for model, epochs in zip(scen.rates.ids, scen.true_epochs):
        stays = sorted((m for m in result.timeline.members if m.model == model), key=lambda m: m.start)
        assert stays[-1].epochs_end == pytest.approx(epochs)
        for before, after in zip(stays, stays[1:]):  # progress carries over a checkpoint
            assert after.epochs_start == pytest.approx(before.epochs_end)
            assert after.launched >= before.released - 1e-6
    by_gpu = {}
    for m in result.timeline.members:
        for g in m.gpus:
            by_gpu.setdefault(g, []).append((m.launched, m.released))
    for intervals in by_gpu.values():
        intervals.sort()
        assert all(start >= end - 1e-6 for (_, end), (start, _) in zip(intervals, intervals[1:]))
    assert result.checkpoints == sum(m.outcome is Outcome.CHECKPOINTED for m in result.timeline.members)
