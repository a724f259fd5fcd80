"""Learning over groups on data partitioned by its groups (issue 47): each model visits its
group's parts only; a sharded group's configurations hop from shard to shard (pure, and the
visit log's recovery)."""

from collections import defaultdict

import pytest

from fleet.runtime.control.visits import VisitLog, read_visits
from fleet.schedule import Member, PolicyError, StreamPlan
from fleet.schedule.costs import Overheads
from fleet.schedule.driver import Driver
from fleet.schedule.group_workload import grouped_scenario, on_parts
from fleet.schedule.grouping import with_groups
from fleet.schedule.ledger import Ledger
from fleet.schedule.partitions import PartitionError, Partitions
from fleet.schedule.planners import Grouped, create_policy
from fleet.schedule.planners._group_visits import spread
from fleet.schedule.rates import ModelProfile, RateTable
from fleet.schedule.simulator import Outcome, resumed_scenario, simulate
from fleet.schedule.workloads import paper100

SHARDS = (("big", ((0, 60.0), (1, 20.0))), ("small", ((1, 20.0),)))


def test_a_model_visits_its_groups_parts_each_pass_over_its_shard_there():
    parts = Partitions((60.0, 40.0), 1, 2, SHARDS)
    assert parts.parts_of("big") == (0, 1) and parts.parts_of("small") == (1,)
    assert parts.parts_of(None) == (0, 1) and parts.parts_of("unlisted") == (0, 1)
    # epoch-equivalent: a visit is the group's share of its epoch held there, times N (100)
    assert parts.visit_samples("big", 0) == 75.0 and parts.visit_samples("big", 1) == 25.0
    assert parts.visit_samples("small", 1) == 100.0 and parts.visit_samples(None, 1) == 40.0
    with pytest.raises(PartitionError, match="group 'x'"):
        Partitions((60.0, 40.0), 1, 2, (("x", ((2, 5.0),)),))


def _grouped_ledger(visited=None) -> Ledger:
    profiles = [ModelProfile(m, (10.0,)) for m in ("a-big", "a-small")]
    rates = with_groups(RateTable(tuple(profiles), 1, 100), {"a-big": 1.25, "a-small": 5.0},
                        {"a-big": "big", "a-small": "small"})
    return Ledger(rates, [2.0, 2.0], 2, 1, partitions=Partitions((60.0, 40.0), 1, 2, SHARDS), visited=visited)


def test_the_books_end_an_epoch_when_the_groups_parts_are_visited_and_refuse_another_part():
    ledger = _grouped_ledger({"a-big": [0]})
    assert ledger.visit_ends_epoch("a-small", 1)
    assert ledger.visit_ends_epoch("a-big", 1)
    with pytest.raises(PolicyError, match="a-small does not visit partition 0"):
        ledger.check_launch([StreamPlan((Member("a-small", (0,)),))], "test")
    Driver(Grouped(), ledger, world=None)  # a policy that visits groups' parts runs on them
    assert ledger.view(0.0).to_visit("a-small") == (1,) and ledger.view(0.0).to_visit("a-big") == (1,)


def test_a_policy_that_does_not_visit_groups_is_refused_on_data_partitioned_by_groups():
    with pytest.raises(PolicyError, match="does not plan visits"):
        Driver(create_policy("group-task"), _grouped_ledger(), world=None)


@pytest.fixture(scope="module")
def scenario():
    # 4 groups (Zipf 2: the largest holds ~70 % of the samples) x 2 configurations, 2 nodes of 4
    return on_parts(grouped_scenario(paper100(0), 4, 2.0, 8, configurations=2), 2)


def stays_by_model(result, scenario):
    parts = Partitions(scenario.partition_sizes, scenario.cluster.gpus_per_node, scenario.cluster.nodes,
                       scenario.partition_groups)
    stays = defaultdict(list)
    for record in sorted(result.timeline.members, key=lambda r: r.start):
        stays[record.model].append((parts.of_gpu(record.gpus[0]), record))
    return stays


def test_grouped_visits_a_sharded_groups_parts_every_epoch_and_keeps_small_groups_on_theirs(scenario):
    assert [key for key, shards in scenario.partition_groups if len(shards) > 1] == ["g000"]
    result = simulate(Grouped(), scenario, Overheads())
    assert not result.interrupted and result.epochs_trained == pytest.approx(scenario.true_epochs)
    for model, stays in stays_by_model(result, scenario).items():
        where = [part for part, _ in stays]
        if model.endswith("g000"):  # each epoch a visit of each part: 0.71 of its epoch, then 0.29
            assert len(where) == 2 * scenario.true_epochs[scenario.rates.index(model)]
            epochs = defaultdict(set)
            for part, record in stays:
                epochs[int(record.epochs_start + 1e-6)].add(part)
            assert all(seen == {0, 1} for seen in epochs.values())
        else:
            assert set(where) == {1}
        assert all(r.outcome in (Outcome.HOPPED, Outcome.CONVERGED) for _, r in stays)


def test_grouped_on_parts_resumes_where_its_visits_stood(scenario):
    whole = simulate(Grouped(), scenario, Overheads())
    cut = simulate(Grouped(), scenario, Overheads(), interrupt_at=whole.makespan / 5)
    assert cut.interrupted and any(cut.visited)
    again = resumed_scenario(scenario, cut)
    rest = simulate(Grouped(), again, Overheads())
    assert not rest.interrupted and rest.epochs_trained == pytest.approx(again.true_epochs)
    for model, stays in stays_by_model(rest, again).items():
        first = again.visited[again.rates.index(model)]
        assert not first or stays[0][0] not in first  # a part visited before the stop is not visited again


def test_a_visit_passes_over_the_groups_own_samples_on_its_part():
    parts = Partitions((60.0, 40.0), 1, 2, SHARDS)
    assert parts.pass_samples("big", 0) == 60.0 and parts.pass_samples("big", 1) == 20.0
    assert parts.pass_samples(None, 1) == 40.0 and parts.pass_samples("small", 1) == 20.0


def test_the_visit_log_recovers_the_last_visit_of_an_epoch_among_the_groups_parts(tmp_path):
    # a model of a whole group on part 1: its epoch 1 ended with that one visit, whose line a kill lost
    (tmp_path / "visits.jsonl").write_text("")
    VisitLog(tmp_path).recover({"a-small": (1,), "a-big": (0, 1)}, {"a-small": 1, "a-big": 1},
                               {"a-small": (), "a-big": ()})
    assert [(v["model"], v["epoch"], v["partition"]) for v in read_visits(tmp_path)] == [("a-small", 1, 1)]


def test_spread_widens_the_streams_of_most_work_per_gpu_within_a_node_each():
    work = {"big": 30.0, "small": 5.0}
    assert spread({"big": 2, "small": 1}, 6, work, 2) == {"big": 4, "small": 2}  # big 7.5 a GPU beats small 5
    assert spread({"big": 1, "small": 1}, 8, work, 2) == {"big": 2, "small": 2}  # a node's 2 GPUs each at most
    assert spread({"big": 1}, 1, work, 4) == {"big": 1}
