"""Example: a second framework, "numpy-example": softmax regression trained with plain numpy.

A framework is (see docs/architecture.md, "Adding an engine"):
1. an `Engine` (one replica on one device, built from `EngineOptions`: gradients, the declared
   `gradient_buffer` a collective reduces, optimizer step, evaluation; for epochs and
   checkpoints the base's sequences call its primitives: the learning rate to use and the
   weights in its state, laid out by a `StateLayout`);
2. a `ModelZoo` that builds, describes and sizes the families it supports;
3. a `Framework` object tying them to a `StateCodec` (states to bytes that load without
   running code) and the device questions (GPUs seen, free memory, synchronisation);
4. a package whose module-level ``FRAMEWORK`` is that object, and one line in
   `fleet.engines.registry.FRAMEWORKS`; the spec's ``framework:`` then accepts its name.

This zoo builds one family, ``mlp`` with ``hidden: []`` (a linear classifier); the engine
trains it with SGD at the spec's learning rate and schedule, on the CPU only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from fleet.engines._base import Engine, EnginePhase, Framework, ModelStats, ModelZoo, StateLayout, check_flat
from fleet.engines.options import EngineOptions
from fleet.engines.schedule import epoch_lr
from fleet.engines.tree_codec import TreeStateCodec
from fleet.errors import UserError

LAYOUT = StateLayout(format="example.numpy_engine/1", kind="a numpy-example engine state",
                     keys=frozenset({"model_id", "num_parameters", "params", "epoch", "steps"}),
                     misfits=(ValueError,))


class LinearZoo(ModelZoo):
    """``mlp`` with no hidden layer: weights (inputs x classes) and a bias per class."""

    def _check(self, family: str, params: Mapping[str, Any]) -> None:
        if family != "mlp" or list(params.get("hidden", [])):
            raise UserError(f"family {family!r} {dict(params)}: numpy-example builds mlp with hidden: [] only")

    def build(self, family, params, input_shape, num_classes, *, seed=None) -> dict[str, np.ndarray]:
        self._check(family, params)
        inputs = int(np.prod(input_shape))
        rng = np.random.default_rng(seed)
        return {"w": (rng.standard_normal((inputs, num_classes)) / np.sqrt(inputs)).astype(np.float32),
                "b": np.zeros(num_classes, np.float32)}

    def describe(self, family, params, input_shape, num_classes) -> ModelStats:
        self._check(family, params)
        count = (int(np.prod(input_shape)) + 1) * num_classes
        return ModelStats(count, 4 * count, 2 * count)

    def parameter_bytes(self, family, params, input_shape, num_classes) -> int | None:
        return self.describe(family, params, input_shape, num_classes).param_bytes


class NumpyEngine(Engine):
    """One replica: parameters and gradients in two flat float32 arrays (views give w and b)."""

    codec = TreeStateCodec()
    layout = LAYOUT

    def __init__(self, options: EngineOptions):
        if options.device != "cpu":
            raise UserError(f"device {options.device!r}: numpy-example runs on the CPU only")
        super().__init__(options)  # keeps spec, model_id and input_shape; epoch and steps 0
        model, classes = options.model, options.num_classes
        net = LinearZoo().build(model.family, model.params, self.input_shape, classes, seed=model.seed)
        self.device = "cpu"
        self.params = np.concatenate([net["w"].ravel(), net["b"]])
        self.grads = np.zeros_like(self.params)
        self.num_parameters = self.params.size
        self.shape = (int(np.prod(self.input_shape)), classes)
        self._schedule_lr()

    def _weights(self, flat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        inputs, classes = self.shape
        return flat[: inputs * classes].reshape(inputs, classes), flat[inputs * classes:]

    def _probabilities(self, x: np.ndarray) -> np.ndarray:
        w, b = self._weights(self.params)
        logits = np.asarray(x, np.float32).reshape(len(x), -1) @ w + b
        logits -= logits.max(axis=1, keepdims=True)
        e = np.exp(logits)
        return e / e.sum(axis=1, keepdims=True)

    # -- the interface -----------------------------------------------------------------------

    def compute_gradients(self, x, y) -> float:
        p = self._probabilities(x)
        y = np.asarray(y, np.int64)
        loss = float(-np.log(p[np.arange(len(y)), y] + 1e-12).mean())
        p[np.arange(len(y)), y] -= 1.0
        gw, gb = self._weights(self.grads)
        gw[...] = np.asarray(x, np.float32).reshape(len(x), -1).T @ p / len(y)
        gb[...] = p.mean(axis=0)
        self._phase = EnginePhase.TRAINING
        return loss

    def flat_gradients(self) -> np.ndarray:
        return self.grads  # the buffer itself: a collective reduces it in place

    def gradient_buffer(self) -> np.ndarray:
        return self.grads

    def load_flat_gradients(self, flat) -> None:
        if flat is not self.grads:
            check_flat(flat, self.num_parameters, "gradients")
            self.grads[...] = flat

    def apply_gradients(self) -> None:
        self.params -= self._lr * self.grads
        self.grads[...] = 0.0
        self._steps += 1

    def flat_parameters(self) -> np.ndarray:
        return self.params.copy()

    def load_flat_parameters(self, flat) -> None:
        check_flat(flat, self.num_parameters, "parameters")
        self.params[...] = flat

    def flat_buffers(self) -> np.ndarray:
        return np.empty(0, np.float32)  # no batch-norm statistics

    def load_flat_buffers(self, flat) -> None:
        pass

    def evaluate(self, x, y, batch_size: int = 256) -> dict[str, float]:
        p, y = self._probabilities(x), np.asarray(y, np.int64)
        loss = float(-np.log(p[np.arange(len(y)), y] + 1e-12).mean())
        return {"loss": loss, "accuracy": float((p.argmax(axis=1) == y).mean())}

    # -- the primitives of the base's epochs and checkpoints -----------------------------------

    def _schedule_lr(self) -> None:
        self._lr = epoch_lr(self.spec.train, self._epoch)

    def _model_state(self) -> dict[str, Any]:
        return {"params": self.params.copy()}

    def _load_model_state(self, state: dict[str, Any]) -> None:
        self.load_flat_parameters(np.asarray(state["params"], np.float32))


class NumpyFramework(Framework):
    name = "numpy-example"
    zoo = LinearZoo()
    codec = NumpyEngine.codec

    def version(self) -> str:
        return np.__version__

    def create_engine(self, options: EngineOptions) -> Engine:
        return NumpyEngine(options)  # threads and determinism do not apply

    def visible_gpus(self) -> int:
        return 0

    def free_device_memory(self, device: str) -> int | None:
        return None

    def synchronize(self, device: str) -> None:
        pass

    def release_memory(self, device: str) -> None:
        pass


FRAMEWORK = NumpyFramework()
"""What the registry line names: ``FRAMEWORKS.add("numpy-example", "docs.examples.engine_numpy:FRAMEWORK")``."""
