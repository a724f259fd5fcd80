"""The checkpoint format of each engine's state, pinned.

The layouts below are the ones the engines write, literally: format, the header values, the
keys and their order (the order is part of the bytes). A state laid out so is the bytes the
engine writes, and it loads into a fresh engine that then trains on exactly as the saved one
does; so a change to the engines' code that keeps these passing keeps every checkpoint
written before loadable after, and the reverse.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from fleet.engines import Engine, EngineOptions
from fleet.engines.emulated import EmulatedEngine
from fleet.engines.torch import TorchEngine
from fleet.schedule.rates import RateTable
from fleet.spec import LRSchedule, ModelSpec, TrainSpec

SHAPE, CLASSES = (1, 8, 8), 4
RATES = RateTable.from_dict({"schema": 1, "gpus_per_node": 2, "samples_per_epoch": 640,
                             "models": [{"id": "m-000", "rates": {"1": 400.0, "2": 640.0}}]})
TRAIN = TrainSpec(optimizer="adam", lr=0.01, max_epochs=4, schedule=LRSchedule(kind="step", step_epochs=1, gamma=0.5))


def model(family: str = "mlp", framework: str = "torch") -> ModelSpec:
    params = {"hidden": [16], "dropout": 0.3}
    return ModelSpec(id="m-000", family=family, params=params, framework=framework, train=TRAIN, seed=5)


def batches(count: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((8, *SHAPE)).astype(np.float32), rng.integers(0, CLASSES, 8)) for _ in range(count)]


def trained(engine: Engine) -> Engine:
    """One epoch of 3 steps, then a step into the next (the optimizer and RNGs have moved)."""
    for x, y in batches(3, seed=1):
        engine.train_step(x, y)
    engine.end_epoch()
    engine.train_step(*batches(1, seed=2)[0])
    return engine


def check_old_layout(make: Callable[[], Engine], old_layout: Callable[[Engine, dict], dict[str, Any]]) -> None:
    """`old_layout(engine, state)` is the state in the engine's pinned layout; the engine's
    state is that, byte for byte, and that loads and trains on."""
    engine = trained(make())
    state = engine.state()
    old = old_layout(engine, state)
    assert list(state) == list(old)
    assert engine.state_bytes() == engine.codec.encode(old)
    resumed = make()
    resumed.load_state_bytes(engine.codec.encode(old))
    assert (resumed.epoch, resumed.steps, resumed.lr) == (engine.epoch, engine.steps, engine.lr) == (1, 4, 0.005)
    after = batches(3, seed=3)
    assert [resumed.train_step(x, y) for x, y in after] == [engine.train_step(x, y) for x, y in after]
    np.testing.assert_array_equal(resumed.flat_parameters(), engine.flat_parameters())


def test_the_torch_engine_writes_and_reads_its_old_layout():
    def old_layout(engine: Engine, state: dict) -> dict[str, Any]:
        return {"format": "fleet.torch_engine/1", "model_id": "m-000", "family": "mlp",
                "num_parameters": engine.num_parameters, "model": state["model"], "optimizer": state["optimizer"],
                "epoch": 1, "steps": 4, "rng": state["rng"]}

    check_old_layout(lambda: TorchEngine(EngineOptions(model(), SHAPE, CLASSES, threads=1)), old_layout)


def test_the_tensorflow_engine_writes_and_reads_its_old_layout():
    pytest.importorskip("tensorflow")
    from fleet.engines.tensorflow import TensorFlowEngine  # imports TensorFlow (slow): only this test

    def old_layout(engine: Engine, state: dict) -> dict[str, Any]:
        return {"format": "fleet.tensorflow_engine/1", "model_id": "m-000", "family": "mlp",
                "num_parameters": engine.num_parameters, "parameters": engine.flat_parameters(),
                "buffers": engine.flat_buffers(), "optimizer": state["optimizer"], "epoch": 1, "steps": 4,
                "rng": state["rng"]}

    check_old_layout(lambda: TensorFlowEngine(EngineOptions(model(framework="tensorflow"), SHAPE, CLASSES)),
                     old_layout)


def emulated(grad_size: int = 256) -> EmulatedEngine:
    return EmulatedEngine(EngineOptions(model(), SHAPE, CLASSES), RATES, group_size=2, epochs_to_converge=4,
                          grad_size=grad_size, sleep=lambda s: None)


def test_the_emulated_engine_writes_and_reads_its_old_layout():
    def old_layout(engine: Engine, state: dict) -> dict[str, Any]:
        return {"format": "fleet.emulated_engine/1", "model_id": "m-000", "num_parameters": 256,
                "params": engine.flat_parameters(), "epoch": 1, "steps": 4, "group_samples": 4 * 8 * 2,
                "trained": True}

    check_old_layout(emulated, old_layout)


def test_the_emulated_engine_state_bytes_are_the_old_ones():
    """Plain values only (no framework, no RNG): the very bytes, pinned."""
    old = {"format": "fleet.emulated_engine/1", "model_id": "m-000", "num_parameters": 4,
           "params": np.arange(4, dtype=np.float32), "epoch": 2, "steps": 7, "group_samples": 96, "trained": True}
    engine = emulated(grad_size=4)
    engine.load_state(old)
    data = engine.state_bytes()
    assert data == engine.codec.encode(old)
    assert hashlib.sha256(data).hexdigest() == "bb8be0f2ad3326b4826f9f407b099cad473f9277960cf07989559c775cf4dc28"
