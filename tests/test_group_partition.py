"""`fleet data partition --group-by`: groups placed onto parts by the constrained wrap-around
(issue 47), small groups whole, a large one sharded over consecutive parts."""

import json
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest
import yaml

from conftest import REPO
from fleet.cli import main
from fleet.errors import UserError
from fleet.schedule.grouping import shard_counts
from preprocess.grouped import epoch_scales, load_run_spec, split_members
from preprocess.layout import read_manifest
from preprocess.make import make_synthetic
from preprocess.partition import assign_group_parts, job_partitions, partition_dataset, stratified_order
from preprocess.readers import open_reader
from preprocess.readers.hdf5 import HDF5Reader, shard_files


def test_shard_counts_keeps_small_groups_whole_and_splits_a_large_one_over_consecutive_parts():
    # 100 samples on 2 parts: a share of 50; the group of 60 fills part 0 and spills 10 onto part 1
    assert shard_counts([60, 10, 10, 10, 5, 5], 2) == [[(0, 50), (1, 10)], [(1, 10)], [(1, 10)], [(1, 10)],
                                                       [(1, 5)], [(1, 5)]]
    # no group above the share: every group whole, largest first on the least filled part
    assert shard_counts([30, 30, 20, 20], 2) == [[(0, 30)], [(1, 30)], [(0, 20)], [(1, 20)]]


@pytest.mark.parametrize("seed", range(5))
def test_shard_counts_on_skewed_groups(seed):
    rng = np.random.default_rng(seed)
    sizes = [int(s) for s in rng.zipf(1.6, size=30).clip(1, 400) * 7]
    parts = int(rng.integers(2, 6))
    shards = shard_counts(sizes, parts)
    share = sum(sizes) / parts
    loads = Counter()
    for size, group in zip(sizes, shards):
        assert sum(n for _, n in group) == size and all(n > 0 for _, n in group)
        where = [p for p, _ in group]
        assert where == list(range(where[0], where[0] + len(where)))  # consecutive parts
        assert len(where) == 1 or size > share  # only a group over a part's share is sharded
        loads.update({p: n for p, n in group})
    assert max(loads.values()) <= share + max(sizes) + 1


def test_stratified_order_spreads_each_class_along_it():
    labels = np.array([0] * 60 + [1] * 30 + [2] * 10)
    order = stratified_order(labels, np.random.default_rng(0))
    assert sorted(order.tolist()) == list(range(100))
    for start in range(0, 100, 20):  # any run of 20 holds about 12, 6 and 2 of the classes
        counts = np.bincount(labels[order[start:start + 20]], minlength=3)
        assert np.abs(counts - [12, 6, 2]).max() <= 1


def test_assign_group_parts_covers_every_sample_once_and_keeps_groups_together():
    labels = np.arange(120) % 4
    keys = np.array(["big"] * 80 + ["a"] * 16 + ["b"] * 14 + ["c"] * 10)
    parts, groups = assign_group_parts(labels, keys, 2, seed=3)
    assert sorted(np.concatenate(parts).tolist()) == list(range(120))
    assert all((np.diff(p) > 0).all() for p in parts)
    assert groups == {"a": [[1, 16]], "b": [[1, 14]], "big": [[0, 60], [1, 20]], "c": [[1, 10]]}
    for part, (key, count) in [(0, ("big", 60)), (1, ("big", 20)), (1, ("a", 16))]:
        assert Counter(keys[parts[part]].tolist())[key] == count
    big_on_1 = parts[1][keys[parts[1]] == "big"]
    assert np.bincount(labels[big_on_1], minlength=4).tolist() == [5, 5, 5, 5]  # the shard holds every class
    again = assign_group_parts(labels, keys, 2, seed=3)[0]
    assert all(np.array_equal(a, b) for a, b in zip(parts, again))


def test_partition_dataset_by_groups_writes_keys_and_where_each_group_lives(tmp_path):
    src = make_synthetic(tmp_path / "src.h5", "hdf5", classes=3, samples=90, image_size=4, groups=4,
                         group_skew=2.0, seed=5, progress=False)
    manifest = partition_dataset(src, 2, tmp_path / "parts", progress=False, group_by="groups")
    assert read_manifest(tmp_path / "parts") == manifest and manifest.group_by == "groups"
    sharded = [key for key, parts in manifest.group_parts().items() if len(parts) > 1]
    assert sharded == ["g000"] and manifest.group_parts()["g000"] == (0, 1)
    source_keys = Counter(HDF5Reader(shard_files(src)).group_keys("groups"))
    for k in range(2):
        reader = HDF5Reader([tmp_path / "parts" / f"part-{k:03d}.h5"])
        on_part = Counter(reader.group_keys("groups"))
        assert on_part == {key: shards[k] for key, shards in manifest.group_samples().items() if k in shards}
        assert len(reader) == manifest.sizes[k]
    assert sum((Counter({key: sum(s.values())}) for key, s in manifest.group_samples().items()), Counter()) == \
        source_keys


def test_info_lists_each_groups_parts(tmp_path, capsys):
    src = make_synthetic(tmp_path / "src.h5", "hdf5", classes=3, samples=90, image_size=4, groups=3, group_skew=2.0,
                         progress=False)
    assert main(["data", "partition", "--in", str(src), "--parts", "2", "--out", str(tmp_path / "p"), "--group-by",
                 "groups", "--quiet"]) == 0
    assert "3 groups, 1 split over several parts: g000 over parts 0, 1" in capsys.readouterr().out
    assert main(["data", "info", str(tmp_path / "p")]) == 0
    lines = capsys.readouterr().out.splitlines()
    at = lines.index("group  samples  parts")
    rows = [line.split(maxsplit=2) for line in lines[at + 1:]]
    assert [(key, parts) for key, _, parts in rows] == [("g000", "0, 1"), ("g001", "1"), ("g002", "1")]


def test_partition_by_groups_errors(tmp_path, capsys):
    src = make_synthetic(tmp_path / "src.h5", "hdf5", classes=2, samples=20, image_size=4, progress=False)
    with pytest.raises(UserError, match="no dataset 'groups' of group keys"):
        partition_dataset(src, 2, tmp_path / "p", progress=False, group_by="groups")
    assert main(["data", "partition", "--in", str(src), "--parts", "2", "--out", str(tmp_path / "p"),
                 "--group-by", "regions", "--quiet"]) == 2
    assert "no dataset 'regions' of group keys" in capsys.readouterr().err


def test_a_malformed_group_manifest_is_one_line(tmp_path):
    src = make_synthetic(tmp_path / "src.h5", "hdf5", classes=2, samples=20, image_size=4, groups=2, progress=False)
    partition_dataset(src, 2, tmp_path / "p", progress=False, group_by="groups")
    path = tmp_path / "p" / "partitions.json"
    written = json.loads(path.read_text())
    for groups in ({"g000": [[5, 3]]}, {"g000": [[0, 0]]}, {"g000": "part 0"}, ["g000"]):
        path.write_text(json.dumps({**written, "groups": groups}))
        with pytest.raises(UserError, match="malformed partition manifest"):
            read_manifest(tmp_path / "p")


def _spec_file(tmp_path, parts, policy="grouped", group_by="groups"):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({
        "name": "g", "models": [{"family": "mlp", "name": "a"}, {"family": "mlp", "name": "b"}],
        "data": {"source": "hdf5", "path": str(parts), "image_size": 4, "partitioned": True,
                 "group_by": {"dataset": group_by}, "min_group_samples": 5},
        "train": {"max_epochs": 2, "batch_size": 4}, "scheduler": {"policy": policy},
        "cluster": {"nodes": 2, "gpus_per_node": 2}}))
    return path


def test_a_spec_on_data_partitioned_by_groups_expands_over_them_and_knows_their_parts(tmp_path):
    src = make_synthetic(tmp_path / "src.h5", "hdf5", classes=3, samples=120, image_size=4, groups=3,
                         group_skew=2.0, progress=False)
    manifest = partition_dataset(src, 2, tmp_path / "parts", progress=False, group_by="groups")
    spec = load_run_spec(_spec_file(tmp_path, tmp_path / "parts"))
    assert sorted({m.group for m in spec.models}) == sorted(manifest.groups)
    parts = job_partitions(spec.data, 2, 2)
    assert parts.parts_of("g000") == (0, 1) and all(len(parts.parts_of(key)) == 1 for key in ("g001", "g002"))
    for key, on in manifest.group_samples().items():  # each part's own split of its share of the group
        for part, samples in on.items():
            with open_reader(spec.data, partition=part) as reader:
                keys = np.asarray(reader.group_keys("groups"))
                train = split_members(reader.labels, np.flatnonzero(keys == key), key, 0.1, 0.0, spec.seed)[0]
            assert dict(dict(parts.groups)[key])[part] == len(train) < samples
    scales = epoch_scales(spec)
    for model in spec.models:
        assert scales[model.id] == pytest.approx(parts.samples / sum(n for _, n in dict(parts.groups)[model.group]))


def test_data_partitioned_without_its_groups_is_one_line(tmp_path):
    src = make_synthetic(tmp_path / "src.h5", "hdf5", classes=2, samples=40, image_size=4, groups=2, progress=False)
    partition_dataset(src, 2, tmp_path / "plain", progress=False)
    with pytest.raises(UserError, match=r"^data.group_by: .*plain was partitioned without its groups; partition it "
                                        r"with: fleet data partition --group-by groups$"):
        load_run_spec(_spec_file(tmp_path, tmp_path / "plain"))
    done = subprocess.run([sys.executable, "-m", "fleet", "validate", str(_spec_file(tmp_path, tmp_path / "plain"))],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "partitioned without its groups" in done.stderr
