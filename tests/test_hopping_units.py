"""Model hopping's runtime pieces without MPI: partition sizes from a manifest, the splits of
partitions read as one data set, a member's visit, and the visit log's recovery after a kill."""

import json

import numpy as np
import pytest

from fleet.errors import UserError
from fleet.runtime.control.visits import VisitLog, read_visits
from fleet.runtime.train.trainer import Visit
from fleet.spec.sections import DataSpec
from preprocess.make import make_synthetic
from preprocess.readers import open_reader
from preprocess.partition import job_partitions, partition_dataset
from preprocess.split import split_blocks, split_indices, train_count


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    root = tmp_path_factory.mktemp("parts")
    make_synthetic(root / "all.h5", "hdf5", classes=4, samples=203, image_size=8, channels=3, seed=0, shards=1,
                   progress=False, force=False)
    partition_dataset(root / "all.h5", 2, root / "parts", seed=0, progress=False)
    return root / "parts"


def test_partition_sizes_come_from_the_manifest_as_each_node_splits_its_part(parts):

    data = DataSpec(source="hdf5", path=str(parts), partitioned=True, val_fraction=0.15)
    where = job_partitions(data, nodes=4, gpus_per_node=2)
    assert where.count == 2 and where.nodes_each == 2
    for k in range(2):
        with open_reader(data, partition=k) as reader:
            assert where.sizes[k] == len(split_indices(reader.labels, 0.15, 0)[0])
    assert job_partitions(DataSpec(source="hdf5", path=str(parts)), nodes=3, gpus_per_node=1) is None
    with pytest.raises(UserError, match=r"holds 2 partitions for a job of 3 nodes: 2 partitions do not fit 3 nodes"):
        job_partitions(data, nodes=3, gpus_per_node=1)


@pytest.mark.parametrize("sizes", [[10, 7, 1, 0, 25], [3, 3, 3]])
def test_train_count_is_what_the_split_leaves(sizes):
    labels = np.repeat(np.arange(len(sizes)), sizes)
    assert train_count(sizes, 0.2) == len(split_indices(labels, 0.2, 4)[0])


def test_blocks_split_one_by_one_as_the_nodes_split_them():
    labels = np.random.default_rng(1).integers(0, 5, 300)
    train, val = split_blocks(labels, [120, 180], 0.1, 7)
    first = split_indices(labels[:120], 0.1, 7)
    second = split_indices(labels[120:], 0.1, 7)
    assert np.array_equal(train, np.concatenate([first[0], second[0] + 120]))
    assert np.array_equal(val, np.concatenate([first[1], second[1] + 120]))
    assert np.array_equal(split_blocks(labels, [300], 0.1, 7)[0], split_indices(labels, 0.1, 7)[0])
    with pytest.raises(ValueError):
        split_blocks(labels, [100], 0.1, 7)


def test_a_visit_ends_the_epoch_with_the_last_partition_and_saves_only_a_hop():
    visit = Visit(partition=1, partitions=3, visited=(0,))
    assert not visit.saves_at_leave  # cut short: the last hop stays the state
    assert visit.end() is False and visit.visited == (0, 1) and visit.saves_at_leave
    last = Visit(partition=2, partitions=3, visited=(0, 1))
    assert last.end() is True and last.visited == () and not last.saves_at_leave  # saved with its epoch


def test_the_visit_log_appends_and_recovers_what_a_kill_lost(tmp_path):
    log = VisitLog(tmp_path)
    log.started("a", 1, [2], 0.5)
    assert log.ended("a", 1, 2.0) == 1
    log.left("a", 1, 1, 2.1)
    log.started("b", 0, [0, 1], 0.5)
    log.left("b", None, 1, 1.0)  # the checkpoint signal cut it
    log.started("a", 0, [0], 2.0)
    log.ended("a", 1, 3.0)  # a's epoch 1 ended; then a's first visit of epoch 2 saved, but the kill lost its line
    log.left("a", 0, 1, 3.1)
    assert [(v["model"], v["epoch"], v["partition"], v["job"]) for v in read_visits(tmp_path)] == \
        [("a", 1, 1, 0), ("a", 1, 0, 0)]
    again = VisitLog(tmp_path)
    assert again.job == 1
    again.recover({"a": (0, 1), "c": (0, 1)}, {"a": 1, "c": 0}, {"a": (1,), "c": ()})
    lines = read_visits(tmp_path)
    assert lines[-1] == {"model": "a", "epoch": 2, "partition": 1, "job": 1, "recovered": True}
    assert len(lines) == 3
    # an epoch's last visit lost: its checkpoint says the epoch ended, the log has all but one
    lost = tmp_path / "lost"
    lost.mkdir()
    (lost / "visits.jsonl").write_text(json.dumps({"model": "x", "epoch": 1, "partition": 0, "job": 0}) + "\n")
    VisitLog(lost).recover({"x": (0, 1)}, {"x": 1}, {"x": ()})
    assert [(v["epoch"], v["partition"]) for v in read_visits(lost)] == [(1, 0), (1, 1)]


def test_a_visit_is_logged_once_its_checkpoint_is_committed_not_when_its_pass_ends(tmp_path):
    """A kill between a visit's end and its hop's checkpoint: the model resumes from the
    checkpoint before (epoch 1 done, nothing visited in epoch 2) and visits the partition
    again, so no line may say it visited it already; the same visit saved is logged with the
    times of its pass."""
    log = VisitLog(tmp_path)
    log.started("y", 1, [1], 3.163)
    assert log.ended("y", 2, 3.22) == 1
    assert read_visits(tmp_path) == []  # killed here, while the hop's checkpoint was being saved
    again = VisitLog(tmp_path)
    again.recover({"y": (0, 1)}, {"y": 1}, {"y": ()})
    assert read_visits(tmp_path) == []
    again.started("y", 1, [1], 0.001)
    again.ended("y", 2, 0.057)
    again.left("y", 1, 2, 0.06)
    assert read_visits(tmp_path) == [{"model": "y", "epoch": 2, "partition": 1, "gpus": [1], "start": 0.001,
                                      "end": 0.057, "job": 0}]


def test_a_visits_preprocessors_are_on_its_partitions_nodes():
    from fleet.runtime.control.preprocessors import pick_preprocessors
    from fleet.runtime.launch.topology import assign_roles
    from fleet.spec.sections import ClusterSpec

    cluster = ClusterSpec(nodes=4, gpus_per_node=1, preprocessors_per_node=2)
    topology = assign_roles([n for n in range(4) for _ in range(3)], cluster)
    on = {node: topology.preprocessor_ranks(node) for node in range(4)}
    picked = pick_preprocessors(topology, [], [topology.trainer_rank(0)], 1, nodes=[2, 3])
    assert set(picked) == set(on[2] + on[3])
    busy = [tuple(on[2])]  # a stream on node 2's preprocessors already: the new one takes the idle ones first
    assert set(pick_preprocessors(topology, busy, [topology.trainer_rank(3)], 1, nodes=[2, 3])) <= set(on[2] + on[3])
    assert set(pick_preprocessors(topology, [], [topology.trainer_rank(0)], 1)) == {r for rs in on.values() for r in rs}


def test_a_line_torn_by_a_kill_is_skipped_and_the_next_starts_on_its_own(tmp_path):
    (tmp_path / "visits.jsonl").write_text(json.dumps({"model": "a", "epoch": 1, "partition": 0, "job": 0}) +
                                           '\n{"model": "a", "epo')
    log = VisitLog(tmp_path)
    log.recover({"a": (0, 1, 2)}, {"a": 0}, {"a": (0, 1)})
    assert [(v["epoch"], v["partition"]) for v in read_visits(tmp_path)] == [(1, 0), (1, 1)]
