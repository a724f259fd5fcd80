"""The engine interface: one model replica on one device, as the runtime's trainers see it.

Contract
--------
Ownership and threads
    An engine holds one replica of one model (weights, optimizer state, LR schedule position,
    epoch counter, the RNG it draws dropout masks from) on one device. It is created, used and
    dropped by one trainer thread; it is **not thread-safe**. Engines of different models may
    live side by side in one process (one per thread); process-wide framework settings (torch's
    thread count and cuDNN flags) are set by the last engine built and should agree between them.

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
    loss. It is exactly `compute_gradients(x, y)` followed by `apply_gradients()` (what a
    trainer alone in its group calls; an engine may fuse the two, as the Keras one does).

Training, data-parallel group of m replicas
    Each replica calls `compute_gradients` on its shard (equal shard sizes, so the mean of
    shard means is the batch mean), the group averages the gradients (a collective reduces
    `gradient_buffer()` or `flat_gradients()` in place, then they are divided by m, e.g. with
    `scale_gradients`), each replica calls `load_flat_gradients(avg)` (a no-op when `avg` is
    the engine's own buffer) and `apply_gradients()`. Replicas that start from equal weights
    (`flat_parameters` broadcast from the master, or one checkpoint) then stay equal.
    Batch-norm running statistics are *not* parameters: each replica updates them from its own
    shard; `flat_buffers` / `load_flat_buffers` let a group average or broadcast them.

The gradient buffer (what a collective may assume)
    `gradient_buffer()` is the memory the gradients live in, in the framework's own type
    (a ``torch.Tensor`` for the torch engine, a numpy array for the emulated one), on the
    engine's device: 1-D, contiguous, float32, `num_parameters` elements in parameter order
    (the layout of `flat_gradients()`). It is the same object for the engine's whole life;
    `compute_gradients` overwrites it and `apply_gradients` zeroes it (an engine may fill it
    only when `gradient_buffer()` or `flat_gradients()` is called after `compute_gradients`,
    as the Keras one does: ask for it then, not before). A collective that knows the type may
    reduce it in place between those two calls and then call `load_flat_gradients(buffer)`, a
    no-op; one that does not know the type (another framework's engine) goes through
    `flat_gradients()` on the host instead. Nothing else may keep or resize it.

Evaluation and predictions
    `evaluate(x, y)` gives the mean loss and accuracy in eval mode; `evaluate_with_probabilities`
    gives the same numbers and, from the same forward passes, every sample's class
    probabilities (what the trainer keeps of a model's best epoch); `predict(x)` gives the
    probabilities of unlabelled samples (`fleet predict`). An engine without real outputs (the
    emulated one) returns None for the probabilities.

Epochs
    `end_epoch()` advances the epoch counter and sets the learning rate for the next epoch
    from the model's schedule (see `fleet.engines.schedule.learning_rate`).

Checkpoints
    `state()` returns a self-contained snapshot (host arrays or host tensors and plain Python
    values; it survives a device change) of everything needed to continue exactly: weights
    and buffers, optimizer state, epoch (the schedule position), step count and the engine's
    RNG state. `load_state(state)` on an engine built from the same `ModelSpec` restores it;
    the next steps then give the losses the uninterrupted engine would have given
    (bit-identical on the same device type). `state_bytes()` is the snapshot encoded by the
    engine's `codec` (what a checkpoint stores); `load_state_bytes` decodes and restores it,
    never running code from the bytes. Python's `random` and numpy's global RNGs are not the
    engine's business. The snapshot's keys and their order are the engine class's
    `StateLayout` (below): a checkpoint format, never changed once written (a new layout gets
    a new ``format``).

What the base owns and what an engine fills in
    `Engine` owns every sequence that is the same in all engines; an engine fills in a few
    framework primitives. They are called by the base's sequences (and `_schedule_lr` by the
    engine's constructor), from the thread that owns the engine, in either phase.

    - Construction: an engine's ``__init__(options, ...)`` calls `Engine.__init__(options)`
      first (it keeps `options`, `spec`, `model_id` and `input_shape`; epoch and steps 0,
      phase ``BUILT``), builds its replica, and calls `_schedule_lr()` last.
    - `end_epoch()`: the epoch counter + 1, then `_epoch_ended()` (what the engine resets per
      epoch; nothing by default), then `_schedule_lr()`.
    - `_schedule_lr()` (primitive): sets `_lr` to the schedule's learning rate of epoch
      `_epoch` (`fleet.engines.schedule.epoch_lr`) and hands it to the optimizer; `lr` reads `_lr`.
    - `state()`: ``format``, ``model_id``, ``family`` (where the layout records it) and
      ``num_parameters``; then `_model_state()` (primitive: weights, buffers, optimizer
      state); then ``epoch`` and ``steps``; then `_extra_state()` (RNG states, the engine's own
      counters; none by default).
    - `load_state(state)`: `check_state` (format, keys, model and size, else `UserError`), then
      `_load_model_state(state)` (primitive; the layout's `misfits` it raises become one
      `UserError`: the checkpoint does not fit the network), then epoch and steps, then
      `_load_extra_state(state)` (after the counters: it may reseed from the step count), then
      phase ``BUILT`` and `_schedule_lr()`.
    - The training methods keep `_phase` (``TRAINING`` after a gradient computation) and
      `_steps` (+1 per optimizer step).

Frameworks (`Framework`, `ModelZoo`, `StateCodec`)
    Everything fleet does with a deep-learning framework goes through one `Framework` object
    per framework, found by name in `fleet.engines.registry` (the spec's ``framework``):
    building engines, its model zoo (sizes and FLOPs of a family, the parameter bytes judged
    before building), its state codec, and its devices (GPUs visible, a device's name and free
    memory, synchronising, freeing cached memory). A framework object is created once per
    process, when its module is first imported (which imports the framework: only the
    registry does that, and only when a model needs it); it keeps no state of its own apart
    from what the framework keeps process-wide, and its methods may be called from any thread.
    Devices are strings: ``cpu``, ``cuda`` or ``cuda:<index>``. The emulated device
    (``cluster.device: emulated``) stands in for every framework and uses none.
    A second framework is one new package (engine, zoo, codec, framework object) and one
    entry in `fleet.engines.registry.FRAMEWORKS`.
"""

from __future__ import annotations

import platform
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from fleet.engines.options import EngineOptions
from fleet.errors import UserError

if TYPE_CHECKING:  # annotations only: the spec imports this package (for its framework names)
    from fleet.spec.search import ModelSpec

InputShape = tuple[int, int, int]


def host_device_name(device: str) -> str:
    """A device on the host, named with the processor: ``cpu (x86_64)``."""
    return f"{device} ({platform.processor() or platform.machine()})"


def check_flat(flat: Any, expected: int, what: str) -> None:
    """For implementations: `flat` is a 1-D array-like of `expected` elements (else ValueError)."""
    shape = tuple(flat.shape)
    if shape != (expected,):
        raise ValueError(f"{what}: expected a 1-D array of {expected} elements, got shape {shape}")


def check_predict(count: int, batch_size: int) -> None:
    """For implementations: `predict`'s arguments (N > 0 samples, batch_size >= 1), else ValueError."""
    if count == 0 or batch_size < 1:
        raise ValueError(f"predict: expected N > 0 samples and batch_size >= 1, got {count}, {batch_size}")


def check_evaluate(count: int, labels: int, batch_size: int) -> None:
    """For implementations: `evaluate`'s arguments (N > 0 samples, N labels, batch_size >= 1),
    else ValueError."""
    if count == 0 or labels != count or batch_size < 1:
        raise ValueError(
            f"evaluate: expected N > 0 samples, N labels and batch_size >= 1, got {count}, {labels}, {batch_size}"
        )


@dataclass(frozen=True)
class StateLayout:
    """The layout of an engine class's `state()` snapshot (see "What the base owns" in the
    module docstring for the order of its keys): a checkpoint format, never changed once written.

    Attributes:
        format: the snapshot's ``format`` value, e.g. ``fleet.torch_engine/1``.
        kind: what the snapshot is, in `load_state`'s messages, e.g. ``a torch engine state``.
        keys: the keys `load_state` requires besides ``format``.
        family: whether the snapshot records the model's family after ``model_id``.
        counted: how `load_state`'s message on a size mismatch counts the parameters.
        misfits: the errors `_load_model_state` raises for a snapshot that does not fit the
            network; `load_state` turns them into one `UserError` (none: they propagate).
    """

    format: str
    kind: str
    keys: frozenset[str]
    family: bool = True
    counted: str = "parameters, the network has"
    misfits: tuple[type[Exception], ...] = ()


def check_state(engine: "Engine", state: Any, layout: StateLayout) -> None:
    """`state` is a snapshot in `layout` of `engine`'s model and size (else UserError)."""
    if not isinstance(state, dict) or state.get("format") != layout.format or not layout.keys <= set(state):
        raise UserError(f"checkpoint of model {engine.model_id!r}: not {layout.kind} ({layout.format})")
    if state["model_id"] != engine.model_id:
        raise UserError(f"checkpoint of model {state['model_id']!r} cannot be loaded into model {engine.model_id!r}")
    if state["num_parameters"] != engine.num_parameters:
        raise UserError(
            f"checkpoint of model {engine.model_id!r}: {state['num_parameters']} {layout.counted} "
            f"{engine.num_parameters}"
        )


class EnginePhase(Enum):
    """Where an engine is in its life; see the module docstring."""

    BUILT = "built"
    TRAINING = "training"


class Engine(ABC):
    """One model replica on one device, driven by one trainer thread (not thread-safe).

    The epoch and checkpoint sequences are the base's (template methods); an engine fills in
    the primitives listed under "What the base owns" in the module docstring.

    Attributes:
        options: what the engine was built from.
        spec: the `ModelSpec` it was built from (``options.model``).
        model_id: the `ModelSpec.id` the engine was built from.
        input_shape: ``(channels, height, width)`` of one sample.
        device: the device the replica lives on (``cpu``, ``cuda:0``; the framework's own
            device object where it has one, which compares and prints as that).
        num_parameters: number of trainable parameters (the length of `flat_gradients()`).
        codec: encodes `state()` for `state_bytes` (one per engine class).
        layout: the keys of `state()` (one per engine class).
    """

    options: EngineOptions
    spec: "ModelSpec"
    model_id: str
    input_shape: tuple[int, ...]
    device: Any
    num_parameters: int
    codec: ClassVar["StateCodec"]
    layout: ClassVar[StateLayout]
    # what `phase`, `epoch`, `steps` and `lr` report; the base and the primitives keep them up to date
    _phase: EnginePhase = EnginePhase.BUILT
    _epoch: int = 0
    _steps: int = 0
    _lr: float = 0.0

    def __init__(self, options: EngineOptions):
        """What every engine keeps of its options; an engine calls this first (see the module docstring)."""
        self.options, self.spec = options, options.model
        self.model_id = options.model.id
        self.input_shape = options.input_shape
        self._epoch, self._steps, self._phase = 0, 0, EnginePhase.BUILT

    @property
    def phase(self) -> EnginePhase:
        """`BUILT` until the first gradient computation, then `TRAINING`."""
        return self._phase

    @property
    def epoch(self) -> int:
        """Epochs completed (the number of `end_epoch` calls, restored by `load_state`)."""
        return self._epoch

    @property
    def steps(self) -> int:
        """Optimizer steps taken (restored by `load_state`)."""
        return self._steps

    @property
    def lr(self) -> float:
        """The learning rate the next optimizer step uses."""
        return self._lr

    # -- training ---------------------------------------------------------------------------

    def train_step(self, x: np.ndarray, y: np.ndarray) -> float:
        """Forward, backward and optimizer step on one batch; returns the batch's mean loss."""
        loss = self.compute_gradients(x, y)
        self.apply_gradients()
        return loss

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
    def gradient_buffer(self) -> Any:
        """The gradients' own memory, in the framework's type, on the engine's device.

        See "The gradient buffer" in the module docstring for what a collective may assume.
        """

    @abstractmethod
    def load_flat_gradients(self, flat: Any) -> None:
        """Make `flat` (the layout of `flat_gradients()`: a numpy array, or the framework's
        type like `gradient_buffer()`) the gradients. A no-op when `flat` is that buffer.
        """

    def scale_gradients(self, factor: float) -> None:
        """Multiply the gradients by `factor` in place (e.g. a trainer's share of a batch).

        This default goes through `flat_gradients()` and back; engines whose gradients live
        on a device override it to scale them there.
        """
        flat = self.flat_gradients()
        flat *= np.float32(factor)
        self.load_flat_gradients(flat)

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

    def evaluate_with_probabilities(
        self, x: np.ndarray, y: np.ndarray, batch_size: int = 256
    ) -> tuple[dict[str, float], np.ndarray | None]:
        """`evaluate`'s metrics (the same numbers) and, from the same forward passes, each
        sample's class probabilities: float32 ``(N, classes)``, the softmax of the network's
        outputs, in the order of `x`. None for the probabilities where the engine computes
        none (the emulated engine)."""
        check_evaluate(len(x), len(y), batch_size)
        return self._evaluated(x, y, batch_size, keep=True)

    def predict(self, x: np.ndarray, batch_size: int = 256) -> np.ndarray | None:
        """Class probabilities of `x` (float32 ``(N, classes)``) in eval mode, without
        gradients; None where the engine computes none (the emulated engine)."""
        check_predict(len(x), batch_size)
        return self._predicted(x, batch_size)

    def end_epoch(self) -> None:
        """Count one more epoch and set the learning rate of the next one from the schedule."""
        self._epoch += 1
        self._epoch_ended()
        self._schedule_lr()

    def state(self) -> dict[str, Any]:
        """A snapshot to continue exactly from (host arrays or tensors and plain values only),
        its keys in the order of the engine's `layout` (see the module docstring)."""
        header: dict[str, Any] = {"format": self.layout.format, "model_id": self.model_id}
        if self.layout.family:
            header["family"] = self.spec.family
        header["num_parameters"] = self.num_parameters
        counters = {"epoch": self._epoch, "steps": self._steps}
        return {**header, **self._model_state(), **counters, **self._extra_state()}

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore a `state()` snapshot of an engine built from the same `ModelSpec`.

        Raises:
            UserError: the snapshot belongs to another model, is not this engine's state, or
                does not fit the network.
        """
        check_state(self, state, self.layout)
        try:
            self._load_model_state(state)
        except self.layout.misfits as exc:
            problem = " ".join(str(exc).split())[:300]
            raise UserError(f"checkpoint of model {self.model_id!r}: does not fit its network: {problem}") from None
        self._epoch, self._steps = int(state["epoch"]), int(state["steps"])
        self._load_extra_state(state)
        self._phase = EnginePhase.BUILT
        self._schedule_lr()

    def state_bytes(self) -> bytes:
        """`state()` encoded by the engine's `codec`: what a checkpoint stores."""
        return self.codec.encode(self.state())

    def load_state_bytes(self, data: bytes) -> None:
        """Restore a `state_bytes()` snapshot; nothing in `data` is ever run.

        Raises:
            UserError: the bytes are damaged, not a state of this codec, or of another model.
        """
        try:
            state = self.codec.decode(data)
        except ValueError as exc:
            raise UserError(f"checkpoint of model {self.model_id!r}: engine state refused: {exc}") from None
        self.load_state(state)

    # -- the primitives an engine fills in (called by the base's sequences) ---------------------

    @abstractmethod
    def _schedule_lr(self) -> None:
        """Set `_lr` to the learning rate of epoch `_epoch` (`fleet.engines.schedule.epoch_lr`:
        it reads the spec, a layer above this module) and give it to the optimizer; also the
        last call of an engine's constructor."""

    @abstractmethod
    def _model_state(self) -> dict[str, Any]:
        """The snapshot's weights, buffers and optimizer state (the keys between the header and
        the counters, in the layout's order)."""

    @abstractmethod
    def _load_model_state(self, state: dict[str, Any]) -> None:
        """Restore what `_model_state` wrote (raising one of the layout's `misfits` where it
        does not fit the network)."""

    def _evaluated(
        self, x: np.ndarray, y: np.ndarray, batch_size: int, keep: bool
    ) -> tuple[dict[str, float], np.ndarray | None]:
        """`evaluate`'s metrics and, where `keep`, the probabilities of the same passes (the
        arguments checked). This default: `evaluate`, and no probabilities."""
        return self.evaluate(x, y, batch_size), None

    def _predicted(self, x: np.ndarray, batch_size: int) -> np.ndarray | None:
        """`predict` (the arguments checked). This default: no probabilities."""
        return None

    def _extra_state(self) -> dict[str, Any]:
        """The snapshot's keys after the counters (RNG states, the engine's own counters)."""
        return {}

    def _load_extra_state(self, state: dict[str, Any]) -> None:
        """Restore what `_extra_state` wrote; called after the epoch and steps are restored."""

    def _epoch_ended(self) -> None:
        """Reset what the engine counts per epoch; called by `end_epoch` before `_schedule_lr`."""


@dataclass(frozen=True)
class ModelStats:
    """What a model costs.

    Attributes:
        parameters: number of trainable and frozen parameters (buffers excluded).
        param_bytes: bytes those parameters take.
        flops_per_sample: approximate forward-pass FLOPs for one sample (2 x multiply-adds).
    """

    parameters: int
    param_bytes: int
    flops_per_sample: int


class StateCodec(ABC):
    """Engine states to bytes and back, for checkpoints.

    `decode` must never run code from the bytes (no unpickling of arbitrary objects): a
    checkpoint may have been planted by anyone who can write the run directory. Whether the
    state is one its engine can load is `Engine.load_state`'s to check (states carry a
    ``format`` key for that).
    """

    @abstractmethod
    def encode(self, state: Mapping[str, Any]) -> bytes:
        """The bytes of an `Engine.state()` snapshot."""

    @abstractmethod
    def decode(self, data: bytes) -> dict[str, Any]:
        """The snapshot again. Raises ValueError (one line) for bytes it will not load."""


class ModelZoo(ABC):
    """The model families a framework builds: ``resnet``, ``densenet``, ``cnn``, ``mlp``,
    ``lstm`` (params validated by `fleet.spec.families`) and ``package.module:function``.

    Every method raises `UserError` for an unknown family, bad params or a user model that
    cannot be built.
    """

    @abstractmethod
    def build(
        self, family: str, params: Mapping[str, Any], input_shape: InputShape, num_classes: int, *,
        seed: int | None = None,
    ) -> Any:
        """The family's network in the framework's type, on the host, in training mode;
        `seed` fixes its initial weights in any process."""

    @abstractmethod
    def describe(
        self, family: str, params: Mapping[str, Any], input_shape: InputShape, num_classes: int
    ) -> ModelStats:
        """Parameters, their bytes and approximate forward FLOPs per sample of the model."""

    @abstractmethod
    def parameter_bytes(
        self, family: str, params: Mapping[str, Any], input_shape: InputShape, num_classes: int
    ) -> int | None:
        """Bytes of the model's parameters, counted without allocating them (a model far too
        big must be judged before it is built); None when that cannot be done for it."""


class Framework(ABC):
    """One deep-learning framework as fleet uses it (see "Frameworks" in the module docstring).

    Attributes:
        name: the registry's name for it (the spec's ``framework``), e.g. ``torch``.
        zoo: its model zoo.
        codec: the codec its engines' states are stored with.
    """

    name: str
    zoo: ModelZoo
    codec: StateCodec

    @abstractmethod
    def version(self) -> str:
        """The framework's version, for the profile's record of the hardware and software."""

    @abstractmethod
    def create_engine(self, options: EngineOptions) -> Engine:
        """A replica of ``options.model`` on ``options.device``, bound to it (the framework's
        current device is set), ``options.threads`` host threads for this trainer,
        deterministic kernels if asked.

        Raises:
            UserError: a device it cannot use, or a model it cannot build.
        """

    @abstractmethod
    def visible_gpus(self) -> int:
        """How many GPUs this process sees (0 without any)."""

    @abstractmethod
    def free_device_memory(self, device: str) -> int | None:
        """Bytes free on an accelerator `device`; None for ``cpu`` (the host's memory is the
        caller's to judge) or when unknown."""

    @abstractmethod
    def synchronize(self, device: str) -> None:
        """Wait until the work queued on `device` is done (nothing to do on ``cpu``)."""

    @abstractmethod
    def release_memory(self, device: str) -> None:
        """Give the memory the framework caches on `device` back (after engines are dropped)."""

    def device_name(self, device: str) -> str:
        """What `device` is: the GPU's model name, or the host's processor for ``cpu``."""
        return host_device_name(device)

    def read_legacy_checkpoint(self, data: bytes) -> dict[str, Any] | None:
        """A whole checkpoint file in a format older fleet versions wrote with this framework,
        as ``ModelCheckpoint.to_dict()`` with its ``engine_state`` re-encoded by `codec`; None
        when `data` is in none of them (this default: the framework has no old formats).

        Raises:
            ValueError: one of its formats, but it cannot be loaded safely (one line).
        """
        return None
