"""Fused bundles under a real mpiexec (issue 49): four small CNNs that differ in learning rate
(one of them in epochs too) on one CPU trainer slot and a preprocessor, with `runtime.fuse:
always`, train as one fused model on the stream they share.

A bundle's models see the batches they would see side by side on a stream of their own: the
same run without fusion on four slots (one stream of the four models under `homogeneous`,
which never checkpoints them) gives each model the same weights. A run checkpointed by the
signal mid-epoch resumes its bundle from the models' own checkpoints; its stream after the
resume is another (a new stream's order depends on its members), so there only the epochs,
samples and files are checked.
"""

import json

import numpy as np
import pytest

from fleet.engines.options import EngineOptions
from fleet.engines.torch.engine import TorchEngine
from fleet.inspect import input_shape, num_classes
from fleet.runtime.train.checkpoint import CheckpointStore
from fleet.spec import load_spec
from test_runtime_mpi import events, job_log, results, signal_job, start_train, train, write_spec

pytestmark = [pytest.mark.mpi, pytest.mark.slow]

EPOCHS = {"a": 2, "b": 2, "c": 2, "d": 1}
LRS = {"a": 0.05, "b": 0.1, "c": 0.02, "d": 0.2}


def four_cnns(tmp_path, fuse: str, slots: int, policy: str = "homogeneous", epochs: dict | None = None,
              data: dict | None = None):
    """The spec of four CNNs differing in learning rate and epochs, on `slots` trainer slots."""
    epochs = epochs or EPOCHS
    models = [{"family": "cnn", "name": m, "params": {"channels": [8], "hidden": 16},
               "train": {"lr": LRS[m], "max_epochs": epochs[m]}} for m in epochs]
    train_cfg = {"batch_size": 32, "max_epochs": 2, "optimizer": "sgd", "stop": {"patience": 100}}
    cluster = {"nodes": 1, "gpus_per_node": slots, "preprocessors_per_node": 1}
    return write_spec(tmp_path / f"{fuse}.yaml", models, cluster, policy, train=train_cfg, runtime={"fuse": fuse},
                      **({"data": data} if data else {}))


def final_weights(spec_path, run_dir) -> dict[str, np.ndarray]:
    """Each model's parameters and buffers as its own torch engine loads its last checkpoint."""
    spec = load_spec(str(spec_path))
    store = CheckpointStore(run_dir)
    weights = {}
    for model in spec.models:
        checkpoint = store.load(model.id)
        engine = TorchEngine(EngineOptions(model, input_shape(spec), num_classes(spec)))
        engine.load_state_bytes(checkpoint.engine_state)
        weights[model.id] = np.concatenate([engine.flat_parameters(), engine.flat_buffers()])
    return weights


def by_model(run_dir) -> dict[str, dict]:
    return {m["id"]: m for m in results(run_dir)["models"]}


def test_a_bundle_trains_each_model_as_the_same_run_without_fusion(tmp_path):
    fused, apart = tmp_path / "fused", tmp_path / "apart"
    fused_spec = four_cnns(tmp_path, "always", 1)
    train(2, fused_spec, fused)
    never_spec = four_cnns(tmp_path, "never", 4)
    train(5, never_spec, apart)

    log = events(fused)
    formed = [e for e in log if e["event"] == "bundle_formed"]
    assert [e["models"] for e in formed] == [["a", "b", "c", "d"]] and formed[0]["key"].startswith("cnn(")
    starts = [e for e in log if e["event"] == "member_start"]
    assert sorted(e["model"] for e in starts) == ["a", "b", "c", "d"]
    assert all(e["gpus"] == [0] and e["bundle"] == ["a", "b", "c", "d"] for e in starts)
    assert not any(e["event"].startswith("bundle_") for e in events(apart))
    # d leaves the bundle after its one epoch; the slot is the bundle's until the last model leaves
    left = [e["model"] for e in log if e["event"] == "member_left"]
    assert left[0] == "d" and sorted(left) == ["a", "b", "c", "d"]

    runs = {"fused": by_model(fused), "apart": by_model(apart)}
    for model, epochs in EPOCHS.items():
        mine, theirs = runs["fused"][model], runs["apart"][model]
        assert mine["epochs"] == epochs and mine["converged"] and mine["stop_reason"] == "max_epochs"
        np.testing.assert_allclose([h["train_loss"] for h in mine["history"]],
                                   [h["train_loss"] for h in theirs["history"]], rtol=1e-4)
        assert mine["gpu_seconds"] > 0
    mine, theirs = final_weights(fused_spec, fused), final_weights(never_spec, apart)
    for model in EPOCHS:
        np.testing.assert_allclose(mine[model], theirs[model], atol=1e-4, err_msg=model)
    assert len({tuple(w[:8]) for w in mine.values()}) == 4  # four models, not one copied


def test_a_bundle_checkpointed_by_the_signal_mid_epoch_resumes_from_its_models_checkpoints(tmp_path):
    """fleet-g plans the bundle as one unit; d leaves after its epoch; the signal checkpoints a, b
    and c mid-epoch (exit 75); the next job forms their bundle again from their checkpoints and
    finishes every epoch once, each a whole pass over the training samples."""
    epochs = {"a": 3, "b": 3, "c": 3, "d": 1}
    data = {"source": "synthetic", "samples": 2400, "image_size": 16, "channels": 3, "val_fraction": 0.1}
    spec = four_cnns(tmp_path, "always", 1, "fleet-g", epochs, data)
    run_dir = tmp_path / "run"
    signal_job(start_train(2, spec, run_dir), run_dir, 4)  # every model's first epoch, then a little
    first = results(run_dir)
    assert first["interrupted"] is True
    saved = {p.parent.name: json.loads(p.read_text()) for p in (run_dir / "checkpoints").glob("*/latest.json")}
    assert sorted(saved) == ["a", "b", "c", "d"] and saved["d"]["converged"], saved
    assert {saved[m]["epoch_samples"] for m in "abc"} != {0}, "the signal was to land mid-epoch"
    train(2, spec, run_dir)
    final = by_model(run_dir)
    for model, count in epochs.items():
        history = final[model]["history"]
        assert [h["epoch"] for h in history] == list(range(1, count + 1)), (model, job_log(run_dir).read_text()[-2000:])
        assert all(h["samples"] == 2160 for h in history), model
    log = events(run_dir)
    formed = [e["models"] for e in log if e["event"] == "bundle_formed"]
    assert formed[0] == ["a", "b", "c", "d"] and formed[-1] == ["a", "b", "c"], formed
    resumed = [e for e in log if e["event"] == "member_start" and e["resume"]]
    assert sorted(e["model"] for e in resumed) == ["a", "b", "c"]
    for model, weights in final_weights(spec, run_dir).items():
        assert np.isfinite(weights).all(), model
