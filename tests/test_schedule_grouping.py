"""Placement of groups' data for learning over groups (`fleet.schedule.grouping`), by hand."""

import numpy as np
import pytest

from fleet.schedule.grouping import Shard, group_bound, place_groups, wrap_around


def test_wrap_around_reaches_mcnaughtons_optimum_and_splits_a_job_over_two_machines_at_most():
    # 3 machines, works 5, 4, 3, 3, 3: C* = max(18 / 3, 5) = 6
    bins = wrap_around([5, 4, 3, 3, 3], 3)
    assert [sum(a for _, a in b) for b in bins] == pytest.approx([6, 6, 6])
    assert bins[0] == [(0, 5), (1, 1)] and bins[1] == [(1, 3), (2, 3)] and bins[2] == [(3, 3), (4, 3)]
    # one job longer than the mean: it alone decides C*, and it is never split
    bins = wrap_around([10, 1, 1], 3)
    assert bins[0] == [(0, 10)] and sum(a for _, a in bins[1]) == pytest.approx(2)


@pytest.mark.parametrize("seed", range(5))
def test_wrap_around_on_random_works(seed):
    rng = np.random.default_rng(seed)
    works = list(rng.pareto(1.2, 40) + 0.1)
    machines = int(rng.integers(2, 12))
    bins = wrap_around(works, machines)
    optimum = max(sum(works) / machines, max(works))
    assert max(sum(a for _, a in b) for b in bins) <= optimum * (1 + 1e-9)
    on = {}
    for m, b in enumerate(bins):
        for job, amount in b:
            on.setdefault(job, []).append((m, amount))
    assert all(len(parts) <= 2 and (len(parts) == 1 or parts[1][0] == parts[0][0] + 1) for parts in on.values())
    assert [sum(a for _, a in on[j]) for j in range(len(works))] == pytest.approx(works)


def test_small_groups_stay_whole_and_only_a_group_larger_than_a_nodes_share_is_sharded():
    # 2 nodes of 4 GPUs; works 12, 3, 2, 2, 1: share 10 per node. The 12 is cut 10 + 2; the
    # small ones go whole, largest first, to the least loaded node (node 1: 2 -> 5 -> 7 -> 9).
    placement = place_groups([12, 3, 2, 2, 1], 2, 4)
    assert placement.shards[0] == (Shard(0, 10 / 12), Shard(1, 2 / 12))
    assert all(len(parts) == 1 and parts[0].fraction == 1.0 for parts in placement.shards[1:])
    assert placement.sharded() == [0]
    assert placement.loads == pytest.approx((10, 10)) and placement.makespan(4) == pytest.approx(2.5)


@pytest.mark.parametrize("seed", range(5))
def test_a_placement_holds_every_group_once_and_stays_near_the_share(seed):
    rng = np.random.default_rng(seed)
    works = list(rng.zipf(1.5, 60).astype(float))
    nodes = int(rng.integers(2, 9))
    placement = place_groups(works, nodes, 4)
    for parts in placement.shards:
        assert sum(p.fraction for p in parts) == pytest.approx(1.0)
    held = [0.0] * nodes
    for g, parts in enumerate(placement.shards):
        for p in parts:
            held[p.node] += works[g] * p.fraction
    assert held == pytest.approx(list(placement.loads))
    whole = [works[g] for g in range(len(works)) if len(placement.shards[g]) == 1]
    assert max(placement.loads) <= placement.share + max(whole, default=0) + 1e-9


def test_the_bound_is_the_mean_work_or_the_longest_model():
    assert group_bound([8, 4], 4, 1.0) == 3.0
    assert group_bound([8, 4], 4, 5.0) == 5.0


def test_nonsense_is_refused():
    with pytest.raises(ValueError):
        wrap_around([1], 0)
    with pytest.raises(ValueError):
        place_groups([-1.0], 1, 1)
    with pytest.raises(ValueError):
        group_bound([1], 0, 0)
    assert wrap_around([0, 0], 2) == [[], []]
