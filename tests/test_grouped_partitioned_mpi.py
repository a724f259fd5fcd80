"""Learning over groups on data partitioned by its groups under a real mpiexec (issue 47): 2
virtual nodes x 2 trainers, 2 parts made by ``fleet data partition --group-by``; the largest
group is split over both parts and its configurations hop from shard to shard, the small
groups lie whole on one part and their models visit only it. The visit log shows each model's
parts once an epoch; a job stopped by the checkpoint signal resumes where its visits stood."""

import json
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
import yaml

from conftest import run_fleet
from preprocess.grouped import split_members
from preprocess.readers.hdf5 import HDF5Reader
from test_hopping_mpi import check_visits_complete, stop_after_visits, visits
from test_runtime_mpi import events, results, start_train, train

pytestmark = [pytest.mark.mpi, pytest.mark.slow]

VAL, SEED = 0.1, 1


@pytest.fixture(scope="module")
def parts(tmp_path_factory) -> Path:
    """1,200 samples in 4 groups of Zipf(2) sizes (843, 211, 94, 52) on 2 parts: g000 split
    600 + 243, the others whole on part 1."""
    root = tmp_path_factory.mktemp("groupparts")
    made = run_fleet("data", "make", "synthetic", "--format", "hdf5", "--out", str(root / "all.h5"), "--samples",
                     "1200", "--image-size", "8", "--classes", "4", "--groups", "4", "--group-skew", "2", "--quiet")
    assert made.returncode == 0, made.stderr
    split = run_fleet("data", "partition", "--in", str(root / "all.h5"), "--parts", "2", "--out", str(root / "parts"),
                      "--group-by", "groups", "--quiet")
    assert split.returncode == 0, split.stderr
    assert "g000 over parts 0, 1" in split.stdout
    return root / "parts"


def write_spec(path: Path, parts: Path, models: list, max_epochs: int) -> Path:
    doc = {
        "name": "groupparts", "seed": SEED,
        "data": {"source": "hdf5", "path": str(parts), "partitioned": True, "image_size": 8, "val_fraction": VAL,
                 "group_by": {"dataset": "groups"}},
        "models": models,
        "train": {"batch_size": 16, "max_epochs": max_epochs, "stop": {"patience": 10}},
        "scheduler": {"policy": "grouped", "profile": False},
        "cluster": {"nodes": 2, "gpus_per_node": 2, "preprocessors_per_node": 1, "virtual_nodes": True,
                    "device": "cpu"},
        "runtime": {"timeout_s": 90, "chunk_samples": 32, "qp_samples": 256, "qt_samples": 256},
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def shard_splits(parts: Path) -> dict[str, dict[int, tuple[int, int]]]:
    """Each group's (training, validation) samples on each part that holds some of it, as
    that part's own split of the group makes them."""
    out: dict[str, dict[int, tuple[int, int]]] = defaultdict(dict)
    for k in range(2):
        with HDF5Reader([parts / f"part-{k:03d}.h5"]) as reader:
            keys, labels = np.asarray(reader.group_keys("groups")), reader.labels
        for key in np.unique(keys):
            train, val, _ = split_members(labels, np.flatnonzero(keys == key), str(key), VAL, 0.0, SEED)
            out[str(key)][k] = (len(train), len(val))
    return out


def check_visits(run_dir: Path, groups: dict[str, str], shards: dict) -> dict[str, dict[int, list[int]]]:
    """Every model visited each of its group's parts exactly once in each epoch it trained."""
    return check_visits_complete(run_dir, lambda model: sorted(shards[groups[model]]))


def check_histories(run_dir: Path, shards: dict, epochs: int) -> None:
    """An epoch trains on the group's training samples of all its parts (a visit of each; a
    visit's last batch of one sample is dropped, as BatchNorm cannot train on one:
    `fleet.runtime.data.queues`) and validates on the held-out samples of all its parts."""
    done = results(run_dir)
    for model in done["models"]:
        on = shards[done["groups"][model["id"]]]
        whole = sum(t for t, _ in on.values())
        assert [h["epoch"] for h in model["history"]] == list(range(1, epochs + 1)), model["id"]
        assert all(whole - len(on) <= h["samples"] <= whole for h in model["history"]), (model["id"], whole)
        assert {h["val_samples"] for h in model["history"]} == {sum(v for _, v in on.values())}, model["id"]


MODELS = [{"family": "mlp", "name": "small", "params": {"hidden": [16]}},
          {"family": "mlp", "name": "wide", "params": {"hidden": [48]}}]


def test_a_sharded_groups_configurations_visit_both_parts_and_small_groups_stay_on_theirs(tmp_path, parts):
    spec = write_spec(tmp_path / "s.yaml", parts, MODELS, max_epochs=2)
    run_dir = tmp_path / "run"
    train(6, spec, run_dir)
    shards = shard_splits(parts)
    assert sorted(shards["g000"]) == [0, 1] and all(list(shards[g]) == [1] for g in ("g001", "g002", "g003"))
    done = results(run_dir)
    assert done["policy"] == "grouped" and len(done["models"]) == 8
    by_model = check_visits(run_dir, done["groups"], shards)
    assert all(set(by_model[f"{c}-g000"][e]) == {0, 1} for c in ("small", "wide") for e in (1, 2))
    check_histories(run_dir, shards, 2)
    node_of = {r["rank"]: r["node"] for r in json.loads((run_dir / "ranks.json").read_text())["ranks"]}
    for end in (e for e in events(run_dir) if e["event"] == "stream_end"):
        for rank, files in end["read_from"].items():
            assert set(files) == {str(parts / f"part-{node_of[int(rank)]:03d}.h5")}, (end["stream"], rank, files)


def test_a_job_stopped_mid_run_resumes_where_its_visits_stood(tmp_path, parts):
    models = [{"family": "cnn", "name": n, "params": {"channels": [8, 16], "hidden": 32}} for n in ("x", "y")]
    spec = write_spec(tmp_path / "s.yaml", parts, models, max_epochs=4)  # visits long enough to stop among them
    run_dir = tmp_path / "run"
    stop_after_visits(start_train(6, spec, run_dir), run_dir, 6)  # the checkpoint signal: exit 75
    first = results(run_dir)
    assert first["interrupted"] is True and len(visits(run_dir)) < 2 * 4 * 5  # 2 configurations: 5 visits an epoch
    train(6, spec, run_dir)
    shards = shard_splits(parts)
    done = results(run_dir)
    assert done["interrupted"] is False
    by_model = check_visits(run_dir, done["groups"], shards)
    assert sum(len(p) for e in by_model.values() for p in e.values()) == 2 * 4 * 5  # nothing visited twice
    assert {line["job"] for line in visits(run_dir)} == {0, 1}
    check_histories(run_dir, shards, 4)
