"""Bundles under a real mpiexec (issue 49): four small CNNs that differ in learning rate (one of
them in epochs too) on one CPU trainer slot and a preprocessor train as one bundle on the
stream they share: fused (`runtime.fuse: always`), or as `measure`'s trial keeps it (fused or one
by one, forced by `runtime.fuse_min_speedup`: 0 keeps fused, 1e9 one by one).

A bundle's models see the batches they would see side by side on a stream of their own: the
same run without fusion on four slots (one stream of the four models under `homogeneous`,
which never checkpoints them) gives each model the same weights, whichever way the bundle
trained. A run checkpointed by the signal mid-epoch resumes its bundle from the models' own
checkpoints, the way its trial kept; its stream after the resume is another (a new stream's
order depends on its members), so there only the epochs, samples and files are checked. Early
stopping stops models of a bundle at a rung while the others train on (emulated models, whose
learning curves are scripted).
"""

import json

import numpy as np
import pytest

from fleet.engines.options import EngineOptions
from fleet.report.results import EARLY_STOP_REASON
from fleet.engines.torch.engine import TorchEngine
from fleet.inspect import input_shape, num_classes
from fleet.runtime.train.checkpoint import CheckpointStore
from fleet.spec import load_spec
from test_runtime_mpi import (
    digits_train_size,
    events,
    job_log,
    results,
    signal_job,
    start_train,
    train,
    write_profile,
    write_spec,
)

pytestmark = [pytest.mark.mpi, pytest.mark.slow]

EPOCHS = {"a": 2, "b": 2, "c": 2, "d": 1}
LRS = {"a": 0.05, "b": 0.1, "c": 0.02, "d": 0.2}


def four_cnns(tmp_path, fuse: str, slots: int, policy: str = "homogeneous", epochs: dict | None = None,
              data: dict | None = None, min_speedup: float = 1.0):
    """The spec of four CNNs differing in learning rate and epochs, on `slots` trainer slots."""
    epochs = epochs or EPOCHS
    models = [{"family": "cnn", "name": m, "params": {"channels": [8], "hidden": 16},
               "train": {"lr": LRS[m], "max_epochs": epochs[m]}} for m in epochs]
    train_cfg = {"batch_size": 32, "max_epochs": 2, "optimizer": "sgd", "stop": {"patience": 100}}
    cluster = {"nodes": 1, "gpus_per_node": slots, "preprocessors_per_node": 1}
    return write_spec(tmp_path / f"{fuse}-{min_speedup:g}.yaml", models, cluster, policy, train=train_cfg,
                      runtime={"fuse": fuse, "fuse_min_speedup": min_speedup}, **({"data": data} if data else {}))


@pytest.fixture(scope="module")
def apart(tmp_path_factory):
    """The four models without fusion, on four slots and one stream: (spec, run directory)."""
    tmp_path = tmp_path_factory.mktemp("apart")
    spec, run_dir = four_cnns(tmp_path, "never", 4), tmp_path / "run"
    train(5, spec, run_dir)
    assert not any(e["event"].startswith("bundle_") for e in events(run_dir))
    return spec, run_dir


def assert_trained_as_apart(spec, run_dir, apart) -> None:
    """Each model trained its epochs, with the losses and final weights (within 1e-4) of the
    run without fusion."""
    mine, theirs = by_model(run_dir), by_model(apart[1])
    for model, epochs in EPOCHS.items():
        assert mine[model]["epochs"] == epochs and mine[model]["converged"]
        assert mine[model]["stop_reason"] == "max_epochs"
        np.testing.assert_allclose([h["train_loss"] for h in mine[model]["history"]],
                                   [h["train_loss"] for h in theirs[model]["history"]], rtol=1e-4)
        assert mine[model]["gpu_seconds"] > 0
    weights, apart_weights = final_weights(spec, run_dir), final_weights(*apart)
    for model in EPOCHS:
        np.testing.assert_allclose(weights[model], apart_weights[model], atol=1e-4, err_msg=model)
    assert len({tuple(w[:8]) for w in weights.values()}) == 4  # four models, not one copied


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


def test_a_bundle_trains_each_model_as_the_same_run_without_fusion(tmp_path, apart):
    fused = tmp_path / "fused"
    fused_spec = four_cnns(tmp_path, "always", 1)
    train(2, fused_spec, fused)

    log = events(fused)
    formed = [e for e in log if e["event"] == "bundle_formed"]
    assert [e["models"] for e in formed] == [["a", "b", "c", "d"]] and formed[0]["key"].startswith("cnn(")
    assert formed[0]["way"] == "fused" and not any(e["event"] == "bundle_decided" for e in log)  # always: no trial
    starts = [e for e in log if e["event"] == "member_start"]
    assert sorted(e["model"] for e in starts) == ["a", "b", "c", "d"]
    assert all(e["gpus"] == [0] and e["bundle"] == ["a", "b", "c", "d"] for e in starts)
    # d leaves the bundle after its one epoch; the slot is the bundle's until the last model leaves
    left = [e["model"] for e in log if e["event"] == "member_left"]
    assert left[0] == "d" and sorted(left) == ["a", "b", "c", "d"]
    assert_trained_as_apart(fused_spec, fused, apart)


@pytest.mark.parametrize("min_speedup, kept", [(0.0, "fused"), (1e9, "one_by_one")])
def test_measure_keeps_the_way_its_trial_decides_and_trains_each_model_as_without_fusion(tmp_path, apart, min_speedup,
                                                                                      kept):
    """The bundle times both ways on its first batches, keeps one (forced here by the knob) and
    says so; each model ends as it does without fusion, whichever way it trained. The job's
    forecast plans the bundle as the run does: its models on one slot, from one start."""
    spec, run_dir = four_cnns(tmp_path, "measure", 1, min_speedup=min_speedup), tmp_path / "run"
    done = train(2, spec, run_dir)
    log = events(run_dir)
    assert [e["way"] for e in log if e["event"] == "bundle_formed"] == [None]
    [decided] = [e for e in log if e["event"] == "bundle_decided"]
    assert decided["models"] == ["a", "b", "c", "d"] and decided["kept"] == kept
    assert decided["fused_step_s"] > 0 and decided["one_by_one_step_s"] > 0
    assert "runtime.fuse measure: 1 bundle(s) of 4 models" in done.stdout
    forecast = {m["model"]: m for m in json.loads((run_dir / "forecast.json").read_text())["members"]}
    assert {(tuple(m["gpus"]), m["start"]) for m in forecast.values()} == {((0,), forecast["a"]["start"])}
    assert forecast["d"]["end"] < forecast["a"]["end"] == forecast["b"]["end"]  # predicted as one bundle
    assert_trained_as_apart(spec, run_dir, apart)


def test_a_bundle_checkpointed_by_the_signal_mid_epoch_resumes_from_its_models_checkpoints(tmp_path):
    """fleet-g plans the bundle as one unit; its trial keeps it one by one; d leaves after its
    epoch; the signal checkpoints a, b and c mid-epoch (exit 75); the next job forms their bundle
    again from their checkpoints, one by one as recorded (no second trial), and finishes every
    epoch once, each a whole pass over the training samples."""
    epochs = {"a": 3, "b": 3, "c": 3, "d": 1}
    data = {"source": "synthetic", "samples": 2400, "image_size": 16, "channels": 3, "val_fraction": 0.1}
    spec = four_cnns(tmp_path, "measure", 1, "fleet-g", epochs, data, min_speedup=1e9)
    run_dir = tmp_path / "run"
    signal_job(start_train(2, spec, run_dir), run_dir, 4, into_epoch=0.5)  # every model's first epoch, half another
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
    formed = [(e["models"], e["way"]) for e in log if e["event"] == "bundle_formed"]
    assert formed[0] == (["a", "b", "c", "d"], None) and formed[-1] == (["a", "b", "c"], "one_by_one"), formed
    assert [e["kept"] for e in log if e["event"] == "bundle_decided"] == ["one_by_one"]
    resumed = [e for e in log if e["event"] == "member_start" and e["resume"]]
    assert sorted(e["model"] for e in resumed) == ["a", "b", "c"]
    for model, weights in final_weights(spec, run_dir).items():
        assert np.isfinite(weights).all(), model


def test_early_stopping_stops_models_of_a_bundle_at_a_rung_while_the_others_train_on(tmp_path):
    """ASHA at rungs of 1 and 2 epochs over four emulated models of one bundle on one slot: each
    model's report reaches its rung on its own; a model stopped there leaves the bundle at once
    (converged, its slot still the bundle's), the others train on in it to the end."""
    models = [{"family": "mlp", "name": m} for m in "abcd"]
    cluster = {"nodes": 1, "gpus_per_node": 1, "preprocessors_per_node": 1, "device": "emulated"}
    spec = write_spec(tmp_path / "s.yaml", models, cluster, "fleet-l", train={"batch_size": 32, "max_epochs": 3},
                      scheduler={"early_stop": {"method": "asha", "min_epochs": 1, "reduction": 2}},
                      runtime={"fuse": "always"})
    run_dir = tmp_path / "run"
    write_profile(run_dir, {m: 4000.0 for m in "abcd"}, {m: 3 for m in "abcd"}, 1, digits_train_size(0.2, 1), 1)
    train(2, spec, run_dir)
    log = events(run_dir)
    assert [e["models"] for e in log if e["event"] == "bundle_formed"] == [["a", "b", "c", "d"]]
    final = by_model(run_dir)
    stopped = sorted(m for m, r in final.items() if r["stop_reason"] == EARLY_STOP_REASON)
    trained_on = sorted(set("abcd") - set(stopped))
    assert stopped and trained_on, final
    assert all(final[m]["epochs"] < 3 for m in stopped) and any(final[m]["epochs"] == 3 for m in trained_on)
    rungs = [e for e in log if e["event"] == "rung"]
    assert {e["model"] for e in rungs if e["verdict"] == "stopped"} == set(stopped)
    left = [e for e in log if e["event"] == "member_left"]
    assert sorted(e["model"] for e in left) == ["a", "b", "c", "d"] and all(e["converged"] for e in left)
    first_stop = min(final[m]["epochs"] for m in stopped)
    assert left[0]["model"] in stopped and left[-1]["model"] in trained_on  # the bundle trained on without it
    assert any(e["event"] == "epoch" and e["epoch"] > first_stop and e["bundle"] for e in log)
