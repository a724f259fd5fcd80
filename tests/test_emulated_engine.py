"""The emulated engine: profiled step times (asserted on the requested sleep), the convergence
contract with the real stop rule, exact state round trips, and the engine interface checks
that the torch engine passes too."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from fleet.engines import Engine, EngineOptions, EnginePhase
from fleet.engines.emulated import EmulatedEngine
from fleet.engines.factory import create_engine
from fleet.engines.torch import TorchEngine
from fleet.errors import UserError
from fleet.runtime.train.stop import StopReason, StopTracker
from fleet.schedule.rates import RateTable
from fleet.spec import ModelSpec, StopRule, TrainSpec

REPO = Path(__file__).resolve().parent.parent
SHAPE, CLASSES = (1, 8, 8), 4
PROFILE = {
    "schema": 1,
    "gpus_per_node": 2,
    "samples_per_epoch": 640,
    "models": [
        {"id": "emu-000", "rates": {"1": 400.0, "2": 640.0}},
        {"id": "emu-001", "rates": {"1": 100.0}, "epochs": 6.4},
    ],
}
RATES = RateTable.from_dict(PROFILE)


def spec(model_id: str = "emu-000", family: str = "mlp", params: dict | None = None, **train) -> ModelSpec:
    return ModelSpec(id=model_id, family=family, params=params or {"hidden": [8]}, train=TrainSpec(**train), seed=5)


def emulated(
    model: ModelSpec | None = None, group_size: int = 1, epochs: int | None = 4, **kwargs
) -> tuple[EmulatedEngine, list[float]]:
    """An engine whose waits are recorded in the returned list instead of slept."""
    slept: list[float] = []
    engine = EmulatedEngine(
        EngineOptions(model or spec(), SHAPE, CLASSES), RATES, group_size, epochs, sleep=slept.append, **kwargs
    )
    return engine, slept


def batch(size: int = 8, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((size, *SHAPE)).astype(np.float32), rng.integers(0, CLASSES, size)


# -- the interface checks, shared with the torch engine -------------------------------------


def check_engine_interface(make: callable) -> None:
    """What the runtime relies on, for any engine; `make()` builds a fresh, equal replica."""
    engine = make()
    assert isinstance(engine, Engine) and engine.phase is EnginePhase.BUILT and engine.epoch == 0
    assert str(engine.device) == "cpu" and isinstance(engine.lr, float)
    x, y = batch()
    loss = engine.compute_gradients(x, y)
    assert isinstance(loss, float) and math.isfinite(loss) and engine.phase is EnginePhase.TRAINING
    flat = engine.flat_gradients()
    assert flat.dtype == np.float32 and flat.shape == (engine.num_parameters,) and flat.flags.c_contiguous
    assert np.any(flat != 0)
    engine.load_flat_gradients(flat)  # its own memory: a no-op
    halved = flat.copy() * 0.5
    engine.load_flat_gradients(halved)
    assert np.array_equal(engine.flat_gradients(), halved)
    buffer = engine.gradient_buffer()  # the framework's own type: what a collective reduces in place
    assert engine.gradient_buffer() is buffer and tuple(buffer.shape) == (engine.num_parameters,)
    engine.load_flat_gradients(buffer)  # the engine's own buffer: a no-op
    assert np.array_equal(engine.flat_gradients(), halved)
    engine.scale_gradients(4.0)
    assert np.array_equal(engine.flat_gradients(), halved * 4)  # exact: a power of two
    engine.load_flat_gradients(halved)
    with pytest.raises(ValueError, match="expected a 1-D array of"):
        engine.load_flat_gradients(np.zeros(3, dtype=np.float32))
    before = engine.flat_parameters()
    engine.apply_gradients()
    after = engine.flat_parameters()
    assert after.dtype == np.float32 and after.shape == (engine.num_parameters,) and not np.array_equal(before, after)
    after[:] = 0  # a copy, not a view
    assert not np.array_equal(engine.flat_parameters(), after)
    buffers = engine.flat_buffers()
    assert buffers.dtype == np.float32 and buffers.ndim == 1
    engine.load_flat_buffers(buffers)

    metrics = engine.evaluate(*batch(20, seed=1), batch_size=7)
    assert set(metrics) == {"loss", "accuracy"} and 0 <= metrics["accuracy"] <= 1 and metrics["loss"] > 0
    with pytest.raises(ValueError):
        engine.evaluate(x[:0], y[:0])
    engine.end_epoch()
    assert engine.epoch == 1

    resumed = make()
    resumed.load_state_bytes(engine.state_bytes())
    assert (resumed.epoch, resumed.lr, resumed.phase) == (1, engine.lr, EnginePhase.BUILT)
    assert np.array_equal(resumed.flat_parameters(), engine.flat_parameters())
    later = [batch(seed=s) for s in range(2, 5)]
    assert [resumed.train_step(*b) for b in later] == [engine.train_step(*b) for b in later]
    assert np.array_equal(resumed.flat_parameters(), engine.flat_parameters())
    with pytest.raises(UserError):
        resumed.load_state({"format": "something else"})

    twin_a, twin_b = make(), make()
    twin_b.compute_gradients(x, y)
    twin_b.apply_gradients()
    assert twin_a.train_step(x, y) == loss  # train_step is compute then apply
    assert np.array_equal(twin_a.flat_parameters(), twin_b.flat_parameters())
    check_data_parallel(make)


def check_data_parallel(make: callable, m: int = 2) -> None:
    """Replicas on different shards, gradients averaged, stay equal."""
    replicas = [make() for _ in range(m)]
    for step in range(3):
        x, y = batch(8 * m, seed=10 + step)
        for replica, xs, ys in zip(replicas, np.split(x, m), np.split(y, m)):
            replica.compute_gradients(xs, ys)
        grads = [r.flat_gradients().copy() for r in replicas]
        assert not np.array_equal(grads[0], grads[1])  # a real reduction is needed
        average = sum(grads) / m
        for replica in replicas:
            replica.load_flat_gradients(average)
            replica.apply_gradients()
    assert np.array_equal(replicas[0].flat_parameters(), replicas[1].flat_parameters())


def test_torch_engine_passes_the_interface_checks():
    model = spec(family="cnn", params={"channels": [2], "hidden": 8})
    check_engine_interface(lambda: TorchEngine(EngineOptions(model, SHAPE, CLASSES)))


def test_emulated_engine_passes_the_interface_checks():
    check_engine_interface(lambda: emulated()[0])


NO_TORCH_SCRIPT = """
import sys
import numpy as np
from fleet.engines import EngineOptions
from fleet.engines.factory import create_engine
from fleet.runtime.train.checkpoint import CheckpointStore, ModelCheckpoint
from fleet.schedule.rates import RateTable
from fleet.spec import parse_spec

spec = parse_spec({"name": "x", "data": {"source": "digits"}, "models": [{"family": "resnet"}]})
rates = RateTable.from_dict({"schema": 1, "gpus_per_node": 1, "samples_per_epoch": 64,
                             "models": [{"id": "resnet-000", "rates": {"1": 1e6}}]})
engine = create_engine(EngineOptions(spec.models[0], (1, 8, 8), 10, device="emulated"), rates=rates)
engine.train_step(np.zeros((4, 1, 8, 8), np.float32), np.zeros(4, np.int64))
store = CheckpointStore(sys.argv[1])
store.save(ModelCheckpoint("resnet-000", engine.state_bytes(), stop={}))
engine.load_state_bytes(store.load("resnet-000").engine_state)
assert "torch" not in sys.modules, "torch was imported"
print("no torch")
"""


def test_the_emulated_device_runs_without_importing_torch(tmp_path):
    """The spec, the engine factory, the emulated engine, its state codec and the checkpoint
    store import no framework: an emulated run needs none installed."""
    done = subprocess.run([sys.executable, "-c", NO_TORCH_SCRIPT, str(tmp_path)], capture_output=True, text=True, cwd=REPO,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "no torch"


# -- timing ---------------------------------------------------------------------------------


def test_a_step_sleeps_the_time_the_profile_predicts():
    engine, slept = emulated(group_size=2)
    engine.compute_gradients(*batch(32))
    assert slept == [pytest.approx(32 * 2 / 640)]  # 0.1 s: the group of 2 does 64 samples at 640/s
    engine.group_size = 1  # resumed on one GPU
    engine.train_step(*batch(32))
    assert slept[-1] == pytest.approx(32 / 400)
    engine.group_size = 3  # beyond the profile: FLEET's extrapolation
    assert engine.step_seconds(32) == pytest.approx(96 / RATES.rate("emu-000", 3))
    assert engine.busy_seconds == pytest.approx(0.1 + 0.08)


def test_a_group_step_takes_the_profiled_time_with_its_allreduce_not_on_top_of_it():
    now = [0.0]
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    engine = EmulatedEngine(EngineOptions(spec(), SHAPE, CLASSES), RATES, group_size=2, sleep=sleep,
                            clock=lambda: now[0])
    for reduce_s in (0.03, 0.25, 0.0):  # this host's allreduce: part of a step, longer than one, none
        engine.compute_gradients(*batch(32))
        now[0] += reduce_s
        engine.apply_gradients()
    engine.compute_gradients(*batch(32))
    assert slept == [pytest.approx(0.1), pytest.approx(0.07), pytest.approx(0.1)]  # the third: none at all
    assert engine.busy_seconds == pytest.approx(0.27)

    alone, waits = emulated(group_size=1)  # no allreduce: every step sleeps the profiled time
    for _ in range(2):
        alone.train_step(*batch(32))
    assert waits == [pytest.approx(32 / 400)] * 2


def test_evaluate_waits_a_fixed_share_of_an_epoch_whatever_the_validation_size():
    engine, slept = emulated(group_size=2, eval_fraction=0.01)
    engine.evaluate(*batch(10))
    engine.evaluate(*batch(1000))
    assert slept == [pytest.approx(0.01 * 640 / 640)] * 2


def test_the_default_wait_is_a_real_sleep_not_a_busy_wait():
    engine = EmulatedEngine(EngineOptions(spec(), SHAPE, CLASSES), RATES, group_size=2)
    assert engine._sleep is __import__("time").sleep


# -- convergence contract -------------------------------------------------------------------


def run_until_stopped(engine: EmulatedEngine, tracker: StopTracker, steps_per_epoch: int = 4, limit: int = 500):
    """The runtime's epoch loop in miniature (evaluate before end_epoch, as fleet.runtime.train.local)."""
    while not tracker.converged and tracker.epochs < limit:
        losses = [engine.train_step(*batch(8)) for _ in range(steps_per_epoch)]
        metrics = engine.evaluate(*batch(16))
        engine.end_epoch()
        tracker.update(
            {"train_loss": float(np.mean(losses)), "val_loss": metrics["loss"], "val_accuracy": metrics["accuracy"]}
        )


@pytest.mark.parametrize("epochs", [2, 3, 7, 40, 120])
@pytest.mark.parametrize("metric", ["val_accuracy", "val_loss"])
def test_patience_fires_after_exactly_e_epochs(epochs, metric):
    rule = StopRule(patience=1, min_delta=0.001, metric=metric)
    engine, _ = emulated(spec(stop=rule, max_epochs=1000), epochs=epochs)
    tracker = StopTracker(rule, max_epochs=1000)
    run_until_stopped(engine, tracker, steps_per_epoch=1)
    assert (tracker.epochs, tracker.reason) == (epochs, StopReason.PATIENCE)
    assert engine.emulated_epochs == epochs


@pytest.mark.parametrize("patience", [2, 5])
def test_longer_patience_still_fires_at_e_when_e_exceeds_it(patience):
    rule = StopRule(patience=patience, min_delta=0.001)
    engine, _ = emulated(spec(stop=rule, max_epochs=100), epochs=8)
    tracker = StopTracker(rule, max_epochs=100)
    run_until_stopped(engine, tracker)
    assert (tracker.epochs, tracker.reason) == (8, StopReason.PATIENCE)


@pytest.mark.parametrize("patience", [1, 3, 6])
def test_capping_max_epochs_at_emulated_epochs_fires_at_e_for_any_rule(patience):
    rule = StopRule(patience=patience, min_delta=0.001)
    model = spec(stop=rule, max_epochs=50)
    engine, _ = emulated(model, epochs=3)
    tracker = StopTracker(rule, max_epochs=min(model.train.max_epochs, engine.emulated_epochs))
    run_until_stopped(engine, tracker)
    assert tracker.epochs == 3 and tracker.converged


def test_without_epochs_to_converge_the_profile_then_max_epochs_decide():
    assert emulated(spec("emu-001"), epochs=None)[0].emulated_epochs == 6  # profile's 6.4
    assert emulated(spec(max_epochs=9), epochs=None)[0].emulated_epochs == 9


def test_metrics_improve_until_e_then_stay_flat_and_train_loss_falls_smoothly():
    engine, _ = emulated(spec(stop=StopRule(patience=1)), epochs=5)
    accuracies, losses = [], []
    for _ in range(7):
        losses += [engine.train_step(*batch(8)) for _ in range(10)]
        accuracies.append(engine.evaluate(*batch(16))["accuracy"])
        engine.end_epoch()
    gains = np.diff(accuracies)
    assert np.all(gains[:3] > 0.05) and np.all(gains[3:] == 0)
    assert np.all(np.diff(losses) < 0) and losses[-1] > 0
    assert 0.80 <= accuracies[-1] <= 0.95


def test_evaluate_scores_the_same_epoch_just_before_or_after_end_epoch():
    before, _ = emulated()
    after, _ = emulated()
    for engine in (before, after):
        engine.train_step(*batch())
    scored_before = before.evaluate(*batch())
    after.end_epoch()
    assert after.evaluate(*batch()) == scored_before


def test_state_round_trip_mid_epoch_keeps_the_curves():
    engine, _ = emulated(epochs=6)
    for _ in range(5):
        engine.train_step(*batch())
    resumed, _ = emulated(epochs=6)
    resumed.load_state_bytes(engine.state_bytes())
    assert (resumed.steps, resumed.epoch) == (5, 0)
    assert resumed.evaluate(*batch()) == engine.evaluate(*batch())
    assert resumed.train_step(*batch()) == engine.train_step(*batch())


def test_load_state_rejects_other_models_and_torch_states():
    engine, _ = emulated()
    other, _ = emulated(spec("emu-001"))
    with pytest.raises(UserError, match="cannot be loaded into model 'emu-000'"):
        engine.load_state(other.state())
    torch_state = TorchEngine(EngineOptions(spec(), SHAPE, CLASSES)).state()
    with pytest.raises(UserError, match="not an emulated engine state"):
        engine.load_state(torch_state)


# -- the factory ----------------------------------------------------------------------------


def test_create_engine_builds_the_emulated_engine_from_the_profile():
    options = EngineOptions(spec(), SHAPE, CLASSES, device="emulated")
    engine = create_engine(options, rates=RATES, group_size=2, epochs_to_converge=3)
    assert isinstance(engine, EmulatedEngine)
    assert (engine.group_size, engine.emulated_epochs, engine.num_parameters) == (2, 3, 256)
    assert isinstance(create_engine(EngineOptions(spec(), SHAPE, CLASSES, device="cpu")), TorchEngine)


def test_emulated_without_rates_is_a_user_error():
    with pytest.raises(UserError, match=r"^cluster.device: emulated needs a profile.json with rates for every model$"):
        create_engine(EngineOptions(spec(), SHAPE, CLASSES, device="emulated"))
    with pytest.raises(UserError, match=r"^profile.json: no rates for model 'emu-404'"):
        create_engine(EngineOptions(spec("emu-404"), SHAPE, CLASSES, device="emulated"), rates=RATES)
