"""`EmulatedEngine`: the engine interface with no network, for ``cluster.device: emulated``.

A training step *sleeps* for the time the profile predicts (``time.sleep``, never a busy
wait), so the real runtime (MPI ranks, queues, collectives, checkpoints, the α rule) can run
16-32 trainers on a laptop's few cores and finish in the time `fleet simulate` predicts.

Timing
    `compute_gradients(x, y)` on a replica of a group of `group_size` = m trainers sleeps
    ``len(x) * m / r(m)`` seconds, with ``r(m) = rates.rate(model.id, m)``: the group
    processes m shards of ``len(x)`` samples per step at ``r(m)`` samples/s. ``r(m)`` is the
    group's rate with its gradients' allreduce, so a replica of a group of 2 or more sleeps
    that much less by what its previous step's allreduce took on this host (between
    `compute_gradients` and `apply_gradients`): the real allreduce of a few emulated parameters
    among ranks that share a laptop's cores stands in for the profiled model's, not on top of
    it; where it takes longer than the whole step, the step takes that long. `evaluate` sleeps
    a fixed ``eval_fraction`` (default 1%) of the predicted epoch time,
    ``samples_per_epoch / r(m)``, whatever the size of the validation set.
    `group_size` is a public attribute: set it when a checkpoint resumes on another GPU count.

Convergence contract (``E = emulated_epochs``)
    ``E`` is `epochs_to_converge`, else the profile's ``epochs`` estimate of the model
    (rounded), else ``model.train.max_epochs``. With ``P = model.train.stop.patience`` the
    validation metrics *improve* for ``I = max(E - P, 0)`` epochs and are constant after::

        f(k)         = min(k, I) / I          (1 when I = 0)
        val_accuracy = chance + (final - chance) * f(k)     chance = 1/num_classes,
                                                            final in [0.80, 0.95] (seeded)
        val_loss     = ln(num_classes) * (1 - 0.8 * f(k))

    where k is the epoch being scored (see `evaluate`). Each improving epoch gains at least
    ``0.3 / I`` accuracy and ``0.55 / I`` loss (e.g. 0.003 and 0.0055 for I = 100), more than any
    reasonable ``min_delta``; so `StopTracker` fires by *patience* exactly after epoch ``E``
    whenever ``E > P``. For ``E <= P`` (or a ``target`` that might fire earlier) the runtime
    caps the tracker at ``E``: ``StopTracker(rule, min(max_epochs, engine.emulated_epochs))``
    fires at ``E`` in every case, which is the simplest thing to always do. The training loss
    falls smoothly with the group's samples seen, ``ln(C) * (0.15 + 0.85 * exp(-3 p / max(I, 1)))``
    with ``p`` = samples / samples_per_epoch; it is always finite (never "diverged").

Numbers
    The "parameters" are `grad_size` float32 values (seeded); gradients are
    ``0.1 * params + noise(seed, step) + 1e-3 * mean(y)``, so replicas given different shards
    have different gradients and a real (small) allreduce is needed to keep them equal.
    `apply_gradients` is plain SGD with the model's LR schedule. No network is built and no
    framework is imported: the buffers are numpy arrays (`gradient_buffer()` too), and the state
    is stored by a `TreeStateCodec` with numpy arrays as they are.
"""

from __future__ import annotations

import math
import time
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np

from fleet.engines._base import Engine, EnginePhase, StateLayout, check_evaluate, check_flat
from fleet.engines.options import EngineOptions
from fleet.engines.schedule import epoch_lr
from fleet.engines.tree_codec import TreeStateCodec
from fleet.errors import UserError
from fleet.schedule.rates import RateTable

LAYOUT = StateLayout(
    format="fleet.emulated_engine/1",
    kind="an emulated engine state",
    keys=frozenset({"model_id", "num_parameters", "params", "epoch", "steps", "group_samples", "trained"}),
    family=False,
    counted="emulated parameters, the engine has",
)
NO_RATES = "cluster.device: emulated needs a profile.json with rates for every model"


def _seed(seed: int, purpose: str) -> int:
    return zlib.crc32(f"{seed}:{purpose}".encode()) & 0x7FFFFFFF


class EmulatedEngine(Engine):
    """A stand-in replica whose steps take the profiled time (see the module docstring).

    Args:
        options: the model (its id, seed, LR schedule and stop rule are used), the sample shape
            (batches are shape-checked), the classes (they set the chance accuracy and the
            initial loss) and the device: ``cpu`` or ``emulated`` (the small buffers always
            live on the CPU); threads and determinism do not apply.
        rates: the profile; must hold the model's id.
        group_size: trainers in this model's data-parallel group (m).
        epochs_to_converge: ``E`` of the convergence contract (None: from the profile).
        grad_size: number of emulated parameters (`num_parameters`).
        eval_fraction: `evaluate` sleeps this fraction of the predicted epoch time.
        sleep: how to wait (injectable for tests); gets seconds.
        clock: monotonic seconds (injectable for tests): times a group's allreduce.

    Raises:
        UserError: the profile has no rates for the model, or a bad device.
    """

    codec = TreeStateCodec()
    layout = LAYOUT

    def __init__(
        self,
        options: EngineOptions,
        rates: RateTable,
        group_size: int = 1,
        epochs_to_converge: int | None = None,
        grad_size: int = 256,
        eval_fraction: float = 0.01,
        sleep: Callable[[float], Any] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ):
        model, device, num_classes = options.model, options.device, options.num_classes
        if model.id not in rates.ids:
            raise UserError(f"profile.json: no rates for model {model.id!r} ({NO_RATES})")
        if getattr(device, "value", device) not in ("cpu", "emulated"):
            raise UserError(f"device {device!r}: the emulated engine runs on 'cpu' (cluster.device: emulated)")
        if group_size < 1 or grad_size < 1 or num_classes < 1 or eval_fraction < 0:
            raise ValueError(
                f"expected group_size, grad_size, num_classes >= 1 and eval_fraction >= 0, "
                f"got {group_size}, {grad_size}, {num_classes}, {eval_fraction}"
            )
        super().__init__(options)
        self.device = "cpu"
        self.num_parameters = int(grad_size)
        self.num_classes = int(num_classes)
        self.rates = rates
        self.group_size = int(group_size)
        self.eval_fraction = float(eval_fraction)
        self.emulated_epochs = self._converge_epochs(epochs_to_converge)
        self.busy_seconds = 0.0
        self._sleep, self._clock = sleep, clock
        self._computed_at: float | None = None  # a group's replica: when its gradients were ready
        self._reduce_s = 0.0  # ... and how long the allreduce after them took
        rng = np.random.default_rng(_seed(model.seed, "emulated:init"))
        self._params = rng.standard_normal(self.num_parameters).astype(np.float32)
        self._grads = np.zeros(self.num_parameters, dtype=np.float32)
        self._final_accuracy = 0.80 + 0.15 * float(rng.random())
        self._group_samples, self._trained = 0, False
        self._schedule_lr()

    def _converge_epochs(self, epochs_to_converge: int | None) -> int:
        if epochs_to_converge is not None:
            if epochs_to_converge < 1:
                raise ValueError(f"epochs_to_converge: expected >= 1, got {epochs_to_converge}")
            return int(epochs_to_converge)
        estimate = self.rates.profile(self.model_id).epochs
        if estimate is not None:
            return max(1, round(estimate))
        return self.spec.train.max_epochs

    # -- properties -------------------------------------------------------------------------

    @property
    def improving_epochs(self) -> int:
        """``I``: epochs over which the validation metrics improve (see the module docstring)."""
        return max(self.emulated_epochs - self.spec.train.stop.patience, 0)

    def step_seconds(self, batch: int) -> float:
        """Predicted time of one step on `batch` samples per replica: ``batch * m / r(m)``."""
        return batch * self.group_size / self.rates.rate(self.model_id, self.group_size)

    def epoch_seconds(self) -> float:
        """Predicted time of one epoch of the whole group: ``samples_per_epoch / r(m)``."""
        return self.rates.samples_per_epoch / self.rates.rate(self.model_id, self.group_size)

    # -- training ---------------------------------------------------------------------------

    def compute_gradients(self, x: np.ndarray, y: np.ndarray) -> float:
        self._check_batch(x, y)
        self._wait(max(0.0, self.step_seconds(len(x)) - self._reduce_s))
        self._computed_at = self._clock() if self.group_size > 1 else None
        loss = self._train_loss()
        noise = np.random.default_rng([_seed(self.spec.seed, "emulated:grad"), self._steps])
        np.multiply(self._params, np.float32(0.1), out=self._grads)
        self._grads += noise.standard_normal(self.num_parameters, dtype=np.float32) * np.float32(0.01)
        self._grads += np.float32(1e-3 * float(np.mean(y)))
        self._group_samples += len(x) * self.group_size
        self._trained = True
        self._phase = EnginePhase.TRAINING
        return loss

    def flat_gradients(self) -> np.ndarray:
        return self._grads

    def gradient_buffer(self) -> np.ndarray:
        """The gradient buffer itself: a numpy array on the host (the same as `flat_gradients()`)."""
        return self._grads

    def load_flat_gradients(self, flat: Any) -> None:
        check_flat(flat, self.num_parameters, "load_flat_gradients")
        flat = np.asarray(flat)  # a host tensor of any framework converts without a copy
        if flat.__array_interface__["data"][0] == self._grads.__array_interface__["data"][0]:
            return  # the caller reduced our own buffer in place
        np.copyto(self._grads, flat.astype(np.float32, copy=False))

    def apply_gradients(self) -> None:
        computed, self._computed_at = self._computed_at, None
        self._reduce_s = self._clock() - computed if computed is not None else 0.0
        self._params -= np.float32(self._lr) * self._grads
        self._grads[:] = 0.0
        self._steps += 1

    # -- replica synchronisation ------------------------------------------------------------

    def flat_parameters(self) -> np.ndarray:
        return self._params.copy()

    def load_flat_parameters(self, flat: np.ndarray) -> None:
        check_flat(flat, self.num_parameters, "load_flat_parameters")
        np.copyto(self._params, np.asarray(flat, dtype=np.float32))

    def flat_buffers(self) -> np.ndarray:
        return np.zeros(0, dtype=np.float32)

    def load_flat_buffers(self, flat: np.ndarray) -> None:
        check_flat(flat, 0, "load_flat_buffers")

    # -- evaluation -------------------------------------------------------------------------

    def evaluate(self, x: np.ndarray, y: np.ndarray, batch_size: int = 256) -> dict[str, float]:
        """Metrics of the epoch being scored, after a fixed wait (see the module docstring).

        The scored epoch is ``epoch + 1`` if a step was taken since the last `end_epoch`, else
        ``epoch``: evaluating just before or just after `end_epoch` gives the same numbers.
        """
        check_evaluate(len(x), len(y), batch_size)
        self._wait(self.eval_fraction * self.epoch_seconds())
        fraction = self._progress(self._epoch + (1 if self._trained else 0))
        chance = 1.0 / max(self.num_classes, 2)
        accuracy = chance + (self._final_accuracy - chance) * fraction
        return {"loss": self._initial_loss() * (1.0 - 0.8 * fraction), "accuracy": accuracy}

    # -- the base's primitives (epochs and checkpoints) -------------------------------------

    def _schedule_lr(self) -> None:
        self._lr = epoch_lr(self.spec.train, self._epoch)

    def _epoch_ended(self) -> None:
        self._trained = False

    def _model_state(self) -> dict[str, Any]:
        return {"params": self._params.copy()}

    def _load_model_state(self, state: dict[str, Any]) -> None:
        np.copyto(self._params, np.asarray(state["params"], dtype=np.float32))
        self._grads[:] = 0.0

    def _extra_state(self) -> dict[str, Any]:
        return {"group_samples": self._group_samples, "trained": self._trained}

    def _load_extra_state(self, state: dict[str, Any]) -> None:
        self._group_samples, self._trained = int(state["group_samples"]), bool(state["trained"])

    # -- helpers ----------------------------------------------------------------------------

    def _wait(self, seconds: float) -> None:
        self.busy_seconds += seconds
        if seconds > 0:
            self._sleep(seconds)

    def _initial_loss(self) -> float:
        return math.log(max(self.num_classes, 2))

    def _progress(self, epoch: int) -> float:
        """``f(k)``: 0 before training, 1 from epoch ``I`` on."""
        improving = self.improving_epochs
        if improving == 0:
            return 1.0
        return min(epoch, improving) / improving

    def _train_loss(self) -> float:
        seen = self._group_samples / self.rates.samples_per_epoch
        return self._initial_loss() * (0.15 + 0.85 * math.exp(-3.0 * seen / max(self.improving_epochs, 1)))

    def _check_batch(self, x: np.ndarray, y: np.ndarray) -> None:
        if x.ndim != 4 or tuple(x.shape[1:]) != self.input_shape or len(y) != len(x) or len(x) == 0:
            raise ValueError(
                f"model {self.model_id!r}: expected x of shape (N, {', '.join(map(str, self.input_shape))}) "
                f"with N > 0 and N labels, got x {tuple(x.shape)} and y {tuple(np.shape(y))}"
            )


