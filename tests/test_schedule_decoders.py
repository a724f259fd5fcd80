"""Which preprocessors decode a stream, and each stream's share of them (`fleet.schedule.decoders`)."""

import pytest

from fleet.schedule import Cluster, ModelProfile, RateTable, Scenario, create_policy, simulate
from fleet.schedule.costs import FREE
from fleet.schedule.decoders import assigned_shares, pick_decoders
from fleet.schedule.stream_physics import decode_shares

NODES = {0: 0, 1: 0, 2: 1, 3: 1}  # preprocessors 0, 1 on node 0; 2, 3 on node 1


def test_a_new_stream_gets_a_fair_share_of_the_least_loaded_preprocessors_local_first():
    assert pick_decoders(NODES, [], [1], launching=1) == (0, 1, 2, 3)  # alone: all of them
    assert pick_decoders(NODES, [], [1], launching=2) == (2, 3)  # one of two starting: half, on its node
    assert pick_decoders(NODES, [(2, 3)], [1], launching=1) == (0, 1)  # the least loaded
    # 5 streams on 4 preprocessors: one each, the least loaded, its node's first
    assert pick_decoders(NODES, [(0,), (1,), (2,)], [0], launching=2) == (3,)
    assert pick_decoders(NODES, [(0,), (1,), (2,), (3,)], [0], launching=1) == (0,)


def test_streams_share_their_own_preprocessors_max_min_fair():
    # a and b share preprocessor 0, c has 1 to itself: 100/s each
    shares = assigned_shares({"a": 500.0, "b": 500.0, "c": 500.0}, {"a": (0,), "b": (0,), "c": (1,)}, 100.0)
    assert shares == pytest.approx({"a": 50.0, "b": 50.0, "c": 100.0})
    # a stream of two preprocessors takes half its pace from each: d on (0, 1) and e on (1,)
    shares = assigned_shares({"d": 500.0, "e": 500.0}, {"d": (0, 1), "e": (1,)}, 100.0)
    assert shares["d"] / 2 + shares["e"] == pytest.approx(100.0) and shares["d"] == pytest.approx(shares["e"])
    # one that needs little leaves the rest to the other
    assert assigned_shares({"a": 10.0, "b": 500.0}, {"a": (0,), "b": (0,)}, 100.0) == pytest.approx({"a": 10.0,
                                                                                                   "b": 90.0})
    # with every stream on every preprocessor, the pooled shares
    assert assigned_shares({"a": 30.0, "b": 500.0}, {"a": (0, 1), "b": (0, 1)}, 100.0) == pytest.approx(
        decode_shares({"a": 30.0, "b": 500.0}, 200.0))


def test_the_simulator_decodes_each_stream_on_the_preprocessors_the_runtime_gives_it():
    # FLEET-L gives a (50/s alone), b (200/s) and c (800/s) a stream each, started together on
    # one node of 3 GPUs and 2 preprocessors of 60/s. Pooled, the three share 120/s: 40/s each,
    # 1.5 s for an epoch of 60. As the runtime assigns them, each gets one preprocessor (2 // 3
    # -> at least one), the least loaded: c and a share preprocessor 0 (30/s each: 2 s), b has
    # preprocessor 1 to itself (60/s: 1 s), which then idles.
    table = RateTable((ModelProfile("a", (50.0,)), ModelProfile("b", (200.0,)), ModelProfile("c", (800.0,))), 3, 60)
    pooled = Scenario(table, (1, 1, 1), (1.0, 1.0, 1.0), Cluster(3, 3), decode_rate=120.0)
    assigned = Scenario(table, (1, 1, 1), (1.0, 1.0, 1.0), Cluster(3, 3), decode_rate=120.0, preprocessors_per_node=2)

    def spans(result):
        return {m.model: m.end - m.start for m in result.timeline.members}

    assert spans(simulate(create_policy("fleet-l"), pooled, FREE)) == pytest.approx({"a": 1.5, "b": 1.5, "c": 1.5})
    assert spans(simulate(create_policy("fleet-l"), assigned, FREE)) == pytest.approx({"a": 2.0, "b": 1.0, "c": 2.0})
