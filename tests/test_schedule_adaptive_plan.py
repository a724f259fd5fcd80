"""fleet-adaptive's plan of the models (planners/_adaptive_plan.py) by hand."""

import numpy as np
import pytest

from fleet.schedule import RateTable
from fleet.schedule.ledger import Ledger
from fleet.schedule.planners._adaptive_plan import ModelPlan, planned_count, planned_counts
from fleet.schedule.planners._drafts import StreamMatcher

USEFUL = np.array([True, True, True, True])


def linear_table() -> RateTable:
    """Two models of r(m) = 10 m samples/s on up to 4 GPUs, 100 samples per epoch."""
    return RateTable.from_dict({"schema": 1, "gpus_per_node": 4, "samples_per_epoch": 100, "models": [
        {"id": m, "rates": {str(g): 10.0 * g for g in range(1, 5)}} for m in ("long", "short")]})


def test_a_model_whose_fastest_time_is_near_the_bound_is_planned_wide_from_its_start():
    # work 50 GPU-s on 4 GPUs: LB2 = 12.5 s, target 1.7 x 12.5 = 21.25 s. "long" (40, 20, 13.3,
    # 10 s) fits the target on 2 GPUs, but at best it finishes at 0.8 x LB2: it gets the fewest
    # GPUs that finish by LB2 itself, all 4. "short" (10 s on 1 GPU) stays on 1
    view = Ledger(linear_table(), (4, 1), total_gpus=4, gpus_per_node=4).view(0.0)
    plan = ModelPlan(1.7, 0.5)
    plan.plan(view)
    assert plan.target == pytest.approx(21.25)
    assert plan.counts == {"long": 4, "short": 1}
    assert plan.queue == ["long", "short"]


def test_a_count_that_fits_the_target_is_kept_where_the_model_finishes_well_within_the_bound():
    # target 17 s, bound 10 s: the count fitting the target is 2 (15 s) in each row
    assert planned_count(np.array([30.0, 15.0, 10.0, 7.5]), USEFUL, 17.0, 1.7) == 3  # best 7.5 s: over 10 / 2
    assert planned_count(np.array([30.0, 15.0, 11.0, 5.5]), USEFUL, 17.0, 1.7) == 4  # best 5.5 s: over 10 / 2
    assert planned_count(np.array([30.0, 15.0, 5.0, 4.0]), USEFUL, 17.0, 1.7) == 2  # best 4 s: within 10 / 2
    assert planned_count(np.array([8.0, 4.0, 3.0, 2.0]), USEFUL, 17.0, 1.7) == 1  # 8 s on 1 GPU: by the bound


def test_a_model_that_cannot_finish_by_the_bound_is_planned_at_its_fastest_useful_count():
    useful = np.array([True, True, True, False])  # 4 GPUs no faster than 3
    assert planned_count(np.array([60.0, 30.0, 20.0, 20.0]), useful, 17.0, 1.7) == 3


def test_a_slower_model_does_not_join_a_critical_model_s_stream_past_its_floor():
    # "crit" at its fastest, 4 GPUs (22 samples/s), takes the bound itself (2,000 / 22 s): held
    # to a slower pace it would finish after it. "slow" (17 samples/s on 1 GPU) is within the
    # hard tolerance of its pace (ln(22 / 17) = 0.26 < 0.35), but starts a stream of its own
    table = RateTable.from_dict({"schema": 1, "gpus_per_node": 4, "samples_per_epoch": 100, "models": [
        {"id": "crit", "rates": {"1": 10.0, "2": 20.0, "3": 21.0, "4": 22.0}},
        {"id": "slow", "rates": {"1": 17.0, "2": 18.0, "3": 18.5, "4": 19.0}}]})
    view = Ledger(table, (20, 1), total_gpus=5, gpus_per_node=4).view(0.0)
    plan = ModelPlan(1.7, 0.5)
    plan.plan(view)
    assert plan.critical == {"crit"} and plan.counts == {"crit": 4, "slow": 1}
    drafts = []
    StreamMatcher(plan, 0.10, 0.02, 0.35, 5.5, 8, 2).fill(view, drafts)
    assert [(d.members, d.low) for d in drafts] == [([("crit", 4)], 22.0), ([("slow", 1)], 17.0)]


def test_models_are_widened_only_while_they_start_in_the_first_wave():
    # each 20 s on 1 GPU, 13.3 s on 2; bound 18 s, target 1.7 x that. Alone on 2
    # GPUs, a model is widened; two on 2 GPUs both widened would run one after the other (26.7 s),
    # so the second in the queue is planned for the target again, moves up the queue (20 s) and
    # leaves the first 1 GPU: both are planned for the target, and neither is critical
    row = [20.0, 40.0 / 3]
    target = 1.7 * 18.0
    counts, critical = planned_counts(np.array([row]), np.array([[True, True]]), target, 1.7, 2)
    assert counts.tolist() == [2] and critical.tolist() == [True]
    counts, critical = planned_counts(np.array([row, row]), np.ones((2, 2), dtype=bool), target, 1.7, 2)
    assert counts.tolist() == [1, 1] and critical.tolist() == [False, False]


def test_a_widened_model_starting_in_the_first_wave_stays_wide_whatever_the_gpu_seconds():
    # 4 GPUs, bound 15 s, target 25.5 s. "long" fits the target on 2 GPUs (16 s) but not the
    # bound: widened to 3 (11 s, 33 GPU-s). Three short models (10 s on 1 GPU)
    # queue after it and fit beside it: it stays wide, though the GPU-seconds (63) exceed the
    # GPUs' until the bound (60); planned for the target it would start as narrow and grow late
    useful = np.ones((4, 3), dtype=bool)
    long, short = [30.0, 16.0, 11.0], [10.0, 6.0, 5.0]
    counts, critical = planned_counts(np.array([long, short, short, short]), useful, 25.5, 1.7, 4)
    assert counts.tolist() == [3, 1, 1, 1] and critical.tolist() == [True, False, False, False]
    # short models of 12 s queue before it (11 s wide): it would start after them, once one
    # finishes, so it is planned for the target (2 GPUs, 16 s) and queues first
    short = [12.0, 7.0, 6.0]
    counts, critical = planned_counts(np.array([long, short, short, short]), useful, 25.5, 1.7, 4)
    assert counts.tolist() == [2, 1, 1, 1] and critical.tolist() == [False, False, False, False]


def test_a_critical_model_starts_on_its_planned_count_though_others_match_the_drafts_better():
    # 6 GPUs, bound 98.75 s. "crit" (2,000 samples; 95 s on 3 GPUs, 87 s at best) is critical and
    # queues third, after "a" and "b" (110 s on 1 GPU; linear scalers); "c", "d", "e" (50 s on 1
    # GPU) match "a"'s pace (10 samples/s) and would join its stream first, leaving "crit" one GPU
    # in that stream (paced at 10, 200 s). Its planned 3 GPUs are kept for it: "a" to "c" share a
    # stream on the other 3, "crit" runs in a stream of its own, "d" and "e" wait
    crit = {"1": 10.0, "2": 20.0, "3": 21.0, "4": 22.0, "5": 22.5, "6": 23.0}
    linear = {str(m): 10.0 * m for m in range(1, 7)}
    poor = {"1": 10.0, "2": 11.0, "3": 11.5, "4": 12.0, "5": 12.2, "6": 12.4}
    table = RateTable.from_dict({"schema": 1, "gpus_per_node": 6, "samples_per_epoch": 100, "models": [
        {"id": "crit", "rates": crit}, {"id": "a", "rates": linear}, {"id": "b", "rates": linear},
        *({"id": m, "rates": poor} for m in "cde")]})
    view = Ledger(table, (20, 11, 11, 5, 5, 5), total_gpus=6, gpus_per_node=6).view(0.0)
    plan = ModelPlan(1.7, 0.5)
    plan.plan(view)
    assert plan.critical == {"crit"} and plan.queue == ["a", "b", "crit", "c", "d", "e"]
    drafts = []
    StreamMatcher(plan, 0.10, 0.02, 0.35, 5.5, 8, 2).fill(view, drafts)
    assert [(d.members, d.low) for d in drafts] == [([("a", 1), ("b", 1), ("c", 1)], 10.0), ([("crit", 3)], 21.0)]
    assert plan.queue == ["d", "e"]
