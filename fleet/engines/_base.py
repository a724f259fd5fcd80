"""The engine interface: one model replica on one device, as the runtime's trainers see it.

Contract
--------
Ownership and threads
    An engine holds one replica of one model (weights, optimizer state, LR schedule position,
    epoch counter, the RNG it draws dropout masks from) on one device. It is created, used and
    dropped by one trainer thread; it is **not thread-safe**. Engines of different models may
    live side by side in one process (one per thread); process-wide torch settings (thread
    count, cuDNN flags) are set by the last engine built and should agree between them.

States (`EnginePhase`)
    ``BUILT``: weights are the seeded initial ones (the same `ModelSpec` gives the same
    weights in every process) or were loaded by `load_state` / `load_flat_parameters`; no
    gradient has been computed yet. ``TRAINING``: after the first `compute_gradients` or
    `train_step`. Every method is valid in both states; the phase only tells a trainer whether
    the replica has diverged from what it was given.

Batches
    ``x`` is float32 ``(N, C, H, W)`` (`input_shape` per sample), ``y`` int64 ``(N,)`` class
    indices; both are host numpy arrays that the engine copies to its device. ``x`` may also
    be `fleet.rows.Pieces`: the rows in consecutive pieces, as the runtime's batches arrive
    (views of the shares they came in); the engine joins them where it uses them (on CUDA
    straight into the pinned buffer of the host-to-device copy, so a batch that spans shares
    is copied once on the host, not twice). The arrays are not kept: the caller may reuse
    their memory as soon as a call returns.

Training, single replica
    `train_step(x, y)` is forward, backward and optimizer step; it returns the batch's mean
    loss. It is exactly `compute_gradients(x, y)` followed by `apply_gradients()`.

Training, data-parallel group of m replicas
    Each replica calls `compute_gradients` on its shard (equal shard sizes, so the mean of
    shard means is the batch mean), the group averages `flat_gradients()` (a collective reduces
    it in place, then divides by m), each replica calls `load_flat_gradients(avg)` (a no-op when
    `avg` is the engine's own buffer) and `apply_gradients()`. Replicas that start from equal
    weights (`flat_parameters` broadcast from the master, or one checkpoint) then stay equal.
    Batch-norm running statistics are *not* parameters: each replica updates them from its own
    shard; `flat_buffers` / `load_flat_buffers` let a group average or broadcast them.

Epochs
    `end_epoch()` advances the epoch counter and sets the learning rate for the next epoch
    from the model's schedule (see `fleet.engines.schedule.learning_rate`).

Checkpoints
    `state()` returns a self-contained snapshot (host tensors and plain Python values; it
    survives `torch.save` / `torch.load(weights_only=False)` and a device change) of
    everything needed to continue exactly: weights and buffers, optimizer state, epoch (the
    schedule position), step count and the engine's torch RNG state. `load_state(state)` on an
    engine built from the same `ModelSpec` restores it; the next steps then give the losses the
    uninterrupted engine would have given (bit-identical on the same device type).
    Python's `random` and numpy's global RNGs are not the engine's business.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from enum import Enum
from typing import Any

import numpy as np


class EnginePhase(Enum):
    """Where an engine is in its life; see the module docstring."""

    BUILT = "built"
    TRAINING = "training"


class Engine(ABC):
    """One model replica on one device, driven by one trainer thread (not thread-safe).

    Attributes:
        model_id: the `ModelSpec.id` the engine was built from.
        device: the device the replica lives on (e.g. ``cpu``, ``cuda:0``).
        num_parameters: number of trainable parameters (the length of `flat_gradients()`).
    """

    model_id: str
    device: Any
    num_parameters: int

    @property
    @abstractmethod
    def phase(self) -> EnginePhase:
        """`BUILT` until the first gradient computation, then `TRAINING`."""

    @property
    @abstractmethod
    def epoch(self) -> int:
        """Epochs completed (the number of `end_epoch` calls, restored by `load_state`)."""

    @property
    @abstractmethod
    def lr(self) -> float:
        """The learning rate the next optimizer step uses."""

    # -- training ---------------------------------------------------------------------------

    @abstractmethod
    def train_step(self, x: np.ndarray, y: np.ndarray) -> float:
        """Forward, backward and optimizer step on one batch; returns the batch's mean loss."""

    @abstractmethod
    def compute_gradients(self, x: np.ndarray, y: np.ndarray) -> float:
        """Forward and backward only: replaces the gradients with this batch's; returns the mean loss."""

    @abstractmethod
    def flat_gradients(self) -> np.ndarray:
        """All gradients as one 1-D contiguous float32 host array (parameter order).

        On the CPU it is a *view* of the buffer the gradients live in, so a collective can
        reduce it in place. On a GPU it is a host copy held in a persistent (pinned) buffer
        that the next call overwrites.
        """

    @abstractmethod
    def load_flat_gradients(self, flat: Any) -> None:
        """Make `flat` (same layout as `flat_gradients()`, numpy or torch) the gradients.

        A no-op when `flat` is already the gradients' memory.
        """

    @abstractmethod
    def apply_gradients(self) -> None:
        """Optimizer step with the current gradients, then zero them."""

    # -- replica synchronisation ------------------------------------------------------------

    @abstractmethod
    def flat_parameters(self) -> np.ndarray:
        """Trainable parameters as one new 1-D float32 host array (buffers excluded)."""

    @abstractmethod
    def load_flat_parameters(self, flat: np.ndarray) -> None:
        """Overwrite the trainable parameters from a `flat_parameters()` layout array."""

    @abstractmethod
    def flat_buffers(self) -> np.ndarray:
        """Floating-point buffers (batch-norm running mean/var) as one new 1-D float32 array.

        Integer buffers (``num_batches_tracked``) are excluded. Empty for models without any.
        """

    @abstractmethod
    def load_flat_buffers(self, flat: np.ndarray) -> None:
        """Overwrite the floating-point buffers from a `flat_buffers()` layout array."""

    # -- evaluation, epochs, checkpoints ----------------------------------------------------

    @abstractmethod
    def evaluate(self, x: np.ndarray, y: np.ndarray, batch_size: int = 256) -> dict[str, float]:
        """``{"loss": mean loss, "accuracy": fraction correct}`` in eval mode, without gradients."""

    @abstractmethod
    def end_epoch(self) -> None:
        """Count one more epoch and set the learning rate of the next one from the schedule."""

    @abstractmethod
    def state(self) -> dict[str, Any]:
        """A snapshot to continue exactly from (host tensors and plain values only)."""

    @abstractmethod
    def load_state(self, state: dict[str, Any]) -> None:
        """Restore a `state()` snapshot of an engine built from the same `ModelSpec`.

        Raises:
            UserError: the snapshot belongs to another model or is not an engine state.
        """
