"""Model hopping over partitioned data in the pure layer: partitions, the driver's rules for
visits, the simulator's sub-epochs and hops, and the two hopping policies (`mop`, `fleet-hop`).

Cerebro's invariants are read back from the simulated timeline: each model visits each
partition exactly once per epoch, one partition at a time, on GPUs of that partition's nodes,
and no GPU holds two models at once.
"""

from dataclasses import replace
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.schedule import (
    Cluster,
    Decision,
    Member,
    ModelProfile,
    Overheads,
    Policy,
    PolicyError,
    RateTable,
    Scenario,
    StreamPlan,
    create_policy,
    lower_bounds,
    paper100,
    simulate,
)
from fleet.schedule.costs import FREE
from fleet.schedule.driver import Driver
from fleet.schedule.ledger import Ledger
from fleet.schedule.partitions import PartitionError, Partitions, nodes_per_partition
from fleet.schedule.planners import HOPPING_POLICIES
from fleet.schedule.planners.hopping import matched_picks
from fleet.schedule.simulator import Outcome, resumed_scenario


def partitioned(workload_rates, epochs, gpus, parts, estimates=None):
    n = workload_rates.samples_per_epoch
    guesses = tuple(float(e) for e in (estimates or epochs))
    return Scenario(workload_rates, tuple(epochs), guesses, Cluster(gpus, workload_rates.gpus_per_node),
                    partition_sizes=(n / parts,) * parts)


def visits_of(result, scen):
    """Per model, the partitions of its visits in time order (a visit cut short by the
    checkpoint signal is no visit)."""
    parts = Partitions(scen.partition_sizes, scen.cluster.gpus_per_node, scen.cluster.nodes)
    seen: dict[str, list[int]] = {}
    for record in sorted(result.timeline.members, key=lambda r: r.start):
        if record.outcome is Outcome.CHECKPOINTED:
            continue
        where = {parts.of_gpu(g) for g in record.gpus}
        assert len(where) == 1, f"{record.model} trained on GPUs of partitions {where}"
        seen.setdefault(record.model, []).append(where.pop())
    return seen


def check_hopping_invariants(result, scen, visited_before=None):
    """Completeness, isolation and exclusivity, and the GPU-time books."""
    p = len(scen.partition_sizes)
    visits = visits_of(result, scen)
    for i, model in enumerate(scen.rates.ids):
        before = list((visited_before or {}).get(model, ()))
        order = before + visits.get(model, [])
        done = scen.resumed[i] if scen.resumed and scen.resumed[i] is not None else 0.0
        epochs_left = scen.true_epochs[i] - int(done + 1e-9)
        assert len(order) == epochs_left * p, (model, order)
        for e in range(epochs_left):  # every partition exactly once per epoch
            assert sorted(order[e * p:(e + 1) * p]) == list(range(p)), (model, order)
    by_model, by_gpu = {}, {}
    for r in result.timeline.members:
        by_model.setdefault(r.model, []).append((r.launched, r.released))
        for g in r.gpus:
            by_gpu.setdefault(g, []).append((r.launched, r.released))
    for intervals in [*by_model.values(), *by_gpu.values()]:  # one place at a time; one model a GPU
        intervals.sort()
        for (_, end), (start, _) in zip(intervals, intervals[1:]):
            assert start >= end - 1e-6
    total = result.gpu_time
    assert total.training + total.pacing + total.overhead + total.idle == pytest.approx(
        result.makespan * scen.cluster.total_gpus, rel=1e-6)


# ------------------------------------------------------------------------ partitions


def test_partitions_live_on_consecutive_node_groups():
    parts = Partitions((10.0, 10.0), gpus_per_node=2, nodes=4)  # 2 nodes a partition
    assert parts.nodes_each == 2
    assert [parts.of_gpu(g) for g in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert list(parts.gpus(1, 8)) == [4, 5, 6, 7]
    assert Partitions.even(4, 100, total_gpus=8, gpus_per_node=2).sizes == (25.0,) * 4


@pytest.mark.parametrize("parts, nodes, message", [
    (3, 4, "3 partitions do not fit 4 nodes: each partition needs the same number of whole nodes "
           "(partitions that fit 4 nodes: 1, 2, 4; make them with: fleet data partition --parts N)"),
    (8, 4, "8 partitions do not fit 4 nodes"),
    (0, 4, "0 partitions on 4 nodes: both must be at least 1"),
])
def test_partitions_that_do_not_fit_the_nodes_say_which_would(parts, nodes, message):
    with pytest.raises(PartitionError) as error:
        nodes_per_partition(parts, nodes)
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


# ------------------------------------------------------------------ the driver's rules

FOUR = RateTable(tuple(ModelProfile(m, (10.0, 18.0)) for m in "abcd"), 2, 100)


class Scripted(Policy):
    name, hops = "scripted", True

    def __init__(self, first):
        self.first = first

    def start(self, view):
        return self.first


class Quiet:
    def now(self):
        return 0.0

    def round_ending(self, index):
        pass

    def checkpoint(self, model):
        pass

    def launch(self, launches, new_round, planning_s):
        self.launches = launches


def hopping_driver(first, visited=None):
    ledger = Ledger(FOUR, [1.0] * 4, 4, 2, partitions=Partitions((50.0, 50.0), 2, 2), visited=visited)
    return Driver(Scripted(first), ledger, Quiet())


@pytest.mark.parametrize("first, visited, message", [
    (Decision(launch=(StreamPlan((Member("a", (1,)), Member("b", (2,)))),)), None, r"spans partitions \[0, 1\]"),
    (Decision(launch=(StreamPlan((Member("a", (2, 3)),)),)), {"a": [1]}, "a already visited partition 1"),
    (Decision(checkpoint=("a",)), None, "not cut short"),
])
def test_visits_break_no_rule(first, visited, message):
    with pytest.raises(PolicyError, match=message):
        hopping_driver(first, visited).start()


def test_a_visit_is_recorded_once_and_ends_the_epoch_with_the_last_partition():
    driver = hopping_driver(Decision(launch=(StreamPlan((Member("a", (0,)), Member("b", (1,)))),)))
    driver.start()
    assert driver.world.launches[0].partition == 0
    driver.visit_completed("a", 0, 0, 10.0)
    assert driver.ledger.model("a").visited == (0,) and driver.ledger.model("a").state.value == "checkpointing"
    with pytest.raises(PolicyError, match="visited partition 0 twice"):
        driver.ledger.visit_done("a", 0)
    driver.checkpointed("a", 0)
    driver.visit_completed("b", 0, 0, 10.0)
    with pytest.raises(PolicyError, match="stalled with 4 models left"):  # it launches nothing more
        driver.checkpointed("b", 0)
    ledger = Ledger(FOUR, [1.0] * 4, 4, 2, partitions=Partitions((50.0, 50.0), 2, 2), visited={"a": [0]})
    ledger.reserve("a", (2,), ledger.open_stream())
    assert ledger.visit_done("a", 1) and ledger.model("a").visited == ()


def test_a_policy_that_does_not_hop_is_refused_on_partitioned_data():
    ledger = Ledger(FOUR, [1.0] * 4, 4, 2, partitions=Partitions((50.0, 50.0), 2, 2))
    with pytest.raises(PolicyError, match="fleet-g does not plan visits of partitioned data"):
        Driver(create_policy("fleet-g"), ledger, Quiet())


# -------------------------------------------------------------------------- simulated


def test_mop_by_hand():
    # 2 models (r = 10/s on 1 GPU), 2 partitions of 50 samples on 2 nodes x 1 GPU, 1 epoch
    # each, free costs: each visit takes 5 s; the two models swap partitions at t = 5.
    rates = RateTable((ModelProfile("a", (10.0,)), ModelProfile("b", (10.0,))), 1, 100)
    scen = partitioned(rates, [1, 1], gpus=2, parts=2)
    result = simulate(create_policy("mop", seed=0), scen, FREE)
    assert result.makespan == pytest.approx(10) and result.hops == 2
    assert result.gpu_time.idle == pytest.approx(0)
    check_hopping_invariants(result, scen)
    hop = Overheads(latency_s=1.0, bandwidth=float("inf"))  # 1 s to checkpoint, 1 s to restore
    assert simulate(create_policy("mop", seed=0), scen, hop).makespan == pytest.approx(5 + 1 + 1 + 5)


@pytest.mark.parametrize("policy", HOPPING_POLICIES)
@pytest.mark.parametrize("gpus, parts", [(16, 4), (16, 2), (8, 1)])
def test_every_model_visits_every_partition_once_an_epoch(policy, gpus, parts):
    workload = paper100(seed=3, models=12)
    scen = partitioned(workload.rates, [max(1, e // 8) for e in workload.true_epochs], gpus, parts)
    result = simulate(create_policy(policy, seed=1), scen, Overheads())
    check_hopping_invariants(result, scen)
    assert result.hops == sum(e * parts - 1 for e in scen.true_epochs)  # no hop after the last visit
    assert result.makespan >= lower_bounds(scen.rates, scen.true_epochs, gpus).lb2 * (1 - 1e-9)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 4), st.integers(1, 3), st.sampled_from([1, 2, 4]), st.integers(1, 6),
       st.sampled_from(HOPPING_POLICIES), st.integers(0, 3))
def test_hopping_invariants_on_random_jobs(gpn, nodes_each, parts, models, policy, seed):
    rates = RateTable(tuple(ModelProfile(f"m{k}", tuple((20 + 13 * k) * m ** 0.8 for m in range(1, 5)))
                            for k in range(models)), gpn, 120)
    scen = partitioned(rates, [1 + (k * 7 + seed) % 3 for k in range(models)], gpn * nodes_each * parts, parts)
    result = simulate(create_policy(policy, seed=seed), scen, Overheads(latency_s=0.5))
    check_hopping_invariants(result, scen)


def test_mop_trains_single_gpu_units_each_decoding_its_own_data():
    workload = paper100(seed=4, models=10)
    scen = partitioned(workload.rates, [2] * 10, gpus=8, parts=2)
    result = simulate(create_policy("mop", seed=0), scen, Overheads())
    assert all(len(r.gpus) == 1 for r in result.timeline.members)
    assert all(len(s.members) == 1 for s in result.timeline.streams)
    assert result.samples_decoded == pytest.approx(sum(scen.true_epochs) * scen.rates.samples_per_epoch)


def test_mop_draws_visits_at_random_reproducibly():
    workload = paper100(seed=4, models=10)
    scen = partitioned(workload.rates, [2] * 10, gpus=16, parts=4)
    orders = [visits_of(simulate(create_policy("mop", seed=s), scen, Overheads()), scen) for s in (0, 0, 1)]
    assert orders[0] == orders[1] and orders[0] != orders[2]


def test_fleet_hop_shares_streams_and_gives_the_tail_several_gpus():
    # 6 copies of one architecture (tied rates) and 2 big models on 2 nodes of 4 GPUs, 2 partitions
    copies = tuple(ModelProfile(f"copy{k}", (100.0, 190.0, 270.0, 340.0)) for k in range(6))
    big = tuple(ModelProfile(f"big{k}", (20.0, 39.0, 57.0, 74.0)) for k in range(2))
    rates = RateTable(copies + big, 4, 4000)
    scen = partitioned(rates, [2] * 6 + [3, 3], gpus=8, parts=2)
    hop = simulate(create_policy("fleet-hop"), scen, Overheads())
    mop = simulate(create_policy("mop", seed=0), scen, Overheads())
    check_hopping_invariants(hop, scen)
    assert max(len(s.members) for s in hop.timeline.streams) >= 2
    assert hop.samples_decoded < 0.9 * mop.samples_decoded  # copies launched together share decoding
    tail = [r for r in hop.timeline.members if r.model.startswith("big") and len(r.gpus) > 1]
    assert tail and all(len({g // 4 for g in r.gpus}) == 1 for r in tail)  # node-local multi-GPU visits
    assert hop.makespan < mop.makespan


def test_fleet_hop_picks_rate_matched_models_from_down_the_work_order():
    # most work first: a (100/s), b (50/s), c (98/s), d (49/s); 2 free GPUs
    rates = RateTable(tuple(ModelProfile(m, (r,)) for m, r in zip("abcd", (100.0, 50.0, 98.0, 49.0))), 1, 100)
    view = SimpleNamespace(rates=rates)
    assert matched_picks(view, list("abcd"), 2, delta=0.1, window=2) == ["a", "c"]  # one stream, not two
    assert matched_picks(view, list("abcd"), 4, delta=0.1, window=2) == ["a", "c", "b", "d"]
    assert matched_picks(view, list("abcd"), 2, delta=0.1, window=1) == ["a", "b"]  # the order kept strictly
    assert matched_picks(view, list("abcd"), 1, delta=0.1, window=4) == ["a"]
    assert matched_picks(view, list("abcd"), 3, delta=0.01, window=4) == ["a", "b", "c"]  # nothing matches


def test_fleet_hop_waits_for_a_hop_in_flight_and_keeps_sharing_after_the_first_visits():
    # 4 architectures x 4 copies (copies tie on rate, their epochs differ), 2 partitions on
    # 2 nodes x 4 GPUs: checkpoints end at different times, so without waiting for the hops
    # on a partition its GPUs come free one by one and each visit decodes alone
    models = tuple(ModelProfile(f"a{a}c{c}", (40.0 + 30 * a,), param_bytes=(1 + 3 * c) * 10**8)
                   for a in range(4) for c in range(4))
    rates = RateTable(models, 4, 4000)
    scen = partitioned(rates, [2 + (k % 3) for k in range(16)], gpus=8, parts=2)
    hop = simulate(create_policy("fleet-hop"), scen, Overheads())
    check_hopping_invariants(hop, scen)
    later = [s for s in hop.timeline.streams if s.start > 0 and len(s.members) > 1]
    assert len(later) >= 5  # shared streams form at every refill, not only at the start
    mop = simulate(create_policy("mop", seed=0), scen, Overheads())
    assert hop.samples_decoded < 0.6 * mop.samples_decoded
    strict = simulate(create_policy("fleet-hop", window=1.0), scen, Overheads())
    assert hop.samples_decoded < strict.samples_decoded


@pytest.mark.parametrize("policy", HOPPING_POLICIES)
def test_an_interrupted_run_resumes_where_its_visits_stood(policy):
    workload = paper100(seed=5, models=8)
    scen = partitioned(workload.rates, [3] * 8, gpus=16, parts=4)
    whole = simulate(create_policy(policy, seed=2), scen, Overheads())
    cut = simulate(create_policy(policy, seed=2), scen, Overheads(), interrupt_at=whole.makespan / 2)
    assert cut.interrupted and any(cut.visited)
    assert any(r.outcome is Outcome.CHECKPOINTED for r in cut.timeline.members)  # visits in flight dropped
    again = resumed_scenario(scen, cut)
    assert again.visited == tuple(v for v, e in zip(cut.visited, cut.epochs_trained) if e < 3)
    for i, done in enumerate(again.resumed):  # a dropped visit is not counted: whole visits only
        if done is not None:
            quarters = done * 4
            assert quarters == pytest.approx(round(quarters)) and round(quarters) % 4 == len(again.visited[i])
    rest = simulate(create_policy(policy, seed=2), again, Overheads())
    before = {m: v for m, v in zip(again.rates.ids, again.visited)}
    check_hopping_invariants(rest, again, visited_before=before)


def test_partitions_share_decoding_by_node_group():
    # decode_rate 40/s for the job: each of 2 partitions' nodes decodes its own at 20/s
    rates = RateTable((ModelProfile("a", (100.0,)), ModelProfile("b", (100.0,))), 1, 100)
    scen = replace(partitioned(rates, [1, 1], gpus=2, parts=2), decode_rate=40.0)
    result = simulate(create_policy("mop", seed=0), scen, FREE)
    assert result.makespan == pytest.approx(50 / 20 * 2)
