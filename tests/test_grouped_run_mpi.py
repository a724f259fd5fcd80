"""Learning over groups (issue 47) under a real mpiexec: two configurations on a synthetic data
set of 4 groups, each (group, configuration) a model that trains and validates on its group's
samples only; and a run stopped by the checkpoint signal mid-run that resumes where it stood."""

from pathlib import Path

import numpy as np
import pytest
import yaml

from preprocess.grouped import group_split
from preprocess.make import make_synthetic
from preprocess.readers.hdf5 import HDF5Reader
from test_runtime_mpi import epochs_by_model, events, results, signal_job, start_train, train

pytestmark = [pytest.mark.mpi, pytest.mark.slow]

VAL, SEED = 0.2, 1


def grouped_spec(tmp_path: Path, samples: int, models: list, max_epochs: int,
                 policy: str = "baseline") -> tuple[Path, Path]:
    """A synthetic data set of `samples` 16x16 images in 4 Zipf-sized groups and a spec of
    `models` on it under `policy` (1 node: 2 CPU trainers, 1 preprocessor)."""
    data = make_synthetic(tmp_path / "data.h5", "hdf5", classes=4, samples=samples, image_size=16, progress=False,
                          groups=4, seed=SEED)
    doc = {
        "name": "grouped", "seed": SEED,
        "data": {"source": "hdf5", "path": str(data), "image_size": 16, "val_fraction": VAL,
                 "group_by": {"dataset": "groups"}, "min_group_samples": 20},
        "models": models,
        "train": {"batch_size": 16, "max_epochs": max_epochs, "optimizer": "sgd", "lr": 0.05},
        "scheduler": {"policy": policy, "profile": False},
        "cluster": {"nodes": 1, "gpus_per_node": 2, "preprocessors_per_node": 1, "device": "cpu"},
        "runtime": {"timeout_s": 90, "chunk_samples": 32, "qp_samples": 256, "qt_samples": 256},
    }
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump(doc))
    return spec, data


def group_splits(data: Path) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Each group's (train, validation, test) indices, from the data set's own group keys."""
    with HDF5Reader([data]) as reader:
        keys = np.asarray(reader.group_keys("groups"))
        labels = reader.labels
    return {key: group_split(labels, keys, key, VAL, 0.0, SEED) for key in np.unique(keys)}


def test_each_model_trains_and_validates_on_its_group_only(tmp_path):
    models = [{"family": "mlp", "name": "small", "params": {"hidden": [16]}},
              {"family": "mlp", "name": "wide", "params": {"hidden": [48]}}]
    spec, data = grouped_spec(tmp_path, 600, models, max_epochs=2)
    run_dir = tmp_path / "run"
    train(3, spec, run_dir)
    splits = group_splits(data)
    done = results(run_dir)
    assert done["groups"] == {f"{c}-{k}": k for c in ("small", "wide") for k in splits}
    sizes = {len(s[0]) for s in splits.values()}
    assert len(sizes) == 4  # skewed: every group's epoch has another size, so a crossing shows
    for model in done["models"]:
        train_idx, val_idx, _ = splits[done["groups"][model["id"]]]
        assert [h["samples"] for h in model["history"]] == [len(train_idx)] * 2, model["id"]
        assert [h["val_samples"] for h in model["history"]] == [len(val_idx)] * 2, model["id"]
    assert done["samples_decoded"] == 2 * 2 * sum(len(s[0]) for s in splits.values())
    starts = [e for e in events(run_dir) if e["event"] == "stream_start"]
    assert sorted(len(e["members"]) for e in starts) == [1] * 8  # baseline: each model its own stream
    again = yaml.safe_load((run_dir / "spec.yaml").read_text())
    assert {m["name"]: m["group"] for m in again["models"]} == done["groups"]


def test_a_grouped_run_stopped_mid_run_resumes_where_it_stood(tmp_path):
    # epochs long enough (0.4-0.9 s on 2 idle cores, more under load) that the stop falls inside one
    models = [{"family": "cnn", "name": n, "params": {"channels": [32, 64], "hidden": 32}} for n in ("x", "y")]
    spec, data = grouped_spec(tmp_path, 9600, models, max_epochs=3)
    run_dir = tmp_path / "run"
    signal_job(start_train(3, spec, run_dir), run_dir, 2)
    first = results(run_dir)
    assert first["interrupted"] is True and len(first["groups"]) == 8
    assert any(e["event"] == "checkpoint" and e["epoch_samples"] > 0 for e in events(run_dir))  # mid-epoch
    train(3, spec, run_dir)
    splits = group_splits(data)
    done = results(run_dir)
    assert done["interrupted"] is False
    for model in done["models"]:
        train_idx, val_idx, _ = splits[done["groups"][model["id"]]]
        assert [h["epoch"] for h in model["history"]] == [1, 2, 3], model["id"]
        assert [h["samples"] for h in model["history"]] == [len(train_idx)] * 3, model["id"]
        assert {h["val_samples"] for h in model["history"]} == {len(val_idx)}
    assert all(sorted(v) == [1, 2, 3] for v in epochs_by_model(run_dir).values())  # each epoch once in all


def test_grouped_trains_each_group_s_configurations_on_one_stream_decoding_it_once(tmp_path):
    models = [{"family": "mlp", "name": "small", "params": {"hidden": [16]}},
              {"family": "mlp", "name": "wide", "params": {"hidden": [48]}}]
    spec, data = grouped_spec(tmp_path, 600, models, max_epochs=2, policy="grouped")
    run_dir = tmp_path / "run"
    train(3, spec, run_dir)
    splits = group_splits(data)
    done = results(run_dir)
    log = events(run_dir)
    streams_of = {}
    for e in log:
        if e["event"] == "member_start":
            streams_of.setdefault(done["groups"][e["model"]], set()).add(e["stream"])
    assert sorted(streams_of) == sorted(splits)  # a configuration that missed its group's stream starts another
    assert sum(len(ids) == 1 for ids in streams_of.values()) >= 1 and max(map(len, streams_of.values())) <= 2
    whole = next(e for e in log if e["event"] == "stream_start" and len(e["members"]) == 2)  # both from the start
    ended = next(e for e in log if e["event"] == "stream_end" and e["stream"] == whole["stream"])
    assert ended["decoded"] == 2 * len(splits[done["groups"][whole["members"][0]]][0])  # once per epoch pass for both
    for model in done["models"]:
        train_idx, val_idx, _ = splits[done["groups"][model["id"]]]
        assert [h["samples"] for h in model["history"]] == [len(train_idx)] * 2, model["id"]
        assert [h["val_samples"] for h in model["history"]] == [len(val_idx)] * 2, model["id"]
    passes = sum(len(s[0]) for s in splits.values())  # one epoch pass over every group
    assert 2 * passes <= done["samples_decoded"] < 2 * 2 * passes  # model-task (baseline) decodes 2 x 2 passes


def test_grouped_starts_a_group_on_the_gpus_it_has_and_its_other_configurations_join_that_stream(tmp_path):
    # three configurations of one architecture (equal rates) trained 4, 2 and 1 epochs, on 2
    # trainers: the 4- and 2-epoch ones start a group's stream; the 1-epoch one joins it when the
    # 2-epoch one leaves (a stream of its own only where the group's stream has ended)
    models = [{"family": "mlp", "name": name, "params": {"hidden": [16]},
               "train": {"max_epochs": epochs, "stop": {"patience": 10}}}
              for name, epochs in (("long", 4), ("one", 1), ("two", 2))]
    spec, data = grouped_spec(tmp_path, 600, models, max_epochs=4, policy="grouped")
    run_dir = tmp_path / "run"
    train(3, spec, run_dir)
    done = results(run_dir)
    log = events(run_dir)
    started_with = {e["stream"]: set(e["members"]) for e in log if e["event"] == "stream_start"}
    joined = [e for e in log if e["event"] == "member_start" and e["model"] not in started_with[e["stream"]]]
    assert joined and all(e["model"].startswith(("one-", "two-")) for e in joined)
    for e in joined:  # a join is into its own group's stream
        assert {done["groups"][m] for m in started_with[e["stream"]]} == {done["groups"][e["model"]]}
    epochs = {"long": 4, "two": 2, "one": 1}
    assert all(len(m["history"]) == epochs[m["id"].split("-")[0]] for m in done["models"])
    assert len(started_with) < 3 * len(group_splits(data))  # fewer streams than models
