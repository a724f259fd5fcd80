"""The collective-backend interface: sums and broadcasts inside one trainer group.

Contract
--------
Ownership and threads
    A collective is created for one trainer group (the m MPI ranks that train one model
    data-parallel) from the group's communicator, which the runtime builds and hands in; rank
    0 of that communicator is the group master. Each member creates its own collective, owned
    by one thread (the trainer's main thread); it is **not thread-safe**. A backend that talks
    over MPI duplicates the communicator first, so its traffic never mixes with the caller's.
    Nothing involves ranks outside the group: groups come and go independently.

Backends by name
    A backend class is registered under a name in `fleet.runtime.train.collectives`
    (``mpi``, ``torch``); the class says which backend it runs on a device (`backend_for`),
    whether this process can use it there (`unavailable`, checked before the group is built,
    so every member decides the same), and builds one member's collective (`for_group`).

States (`CollectiveState`)
    ``OPEN`` after the constructor (which is collective: every member constructs at about the
    same time) until `close`; then ``CLOSED``, where every call but `close` raises
    `CollectiveError`. Every member calls `close` (idempotent); a backend may wait there, up to
    ``timeout_s``, for the other members before it drops what they share (the torch backends
    do: their store must outlive every member's use of it). Closing frees every thread, socket,
    file and communicator the collective made, so a long run can open and close thousands.

Calls
    Every call is collective: all members make the same calls in the same order, with arrays
    of the same length and dtype. Host arrays are 1-D, C-contiguous, writable float32 or
    float64 numpy arrays, reduced or overwritten in place. ``SUM`` is the only reduction: the
    runtime scales each trainer's gradient by ``count_k / total`` before the sum, so a sum is
    the group's mean gradient even when members hold unequal shares of a batch (or none).
    Results agree between members and between backends within float tolerance (summation
    order differs between algorithms, not between members of one call).

Waiting
    Every wait sleeps between checks (no core is spun; MPICH's blocking calls would) and ends
    at ``timeout_s`` with `fleet.runtime.waiting.WaitTimeout`, whose message names the
    operation, the group and this rank's place in it. A collective that failed for another
    reason (a member died, a transport error) raises `CollectiveError`. After either, the
    group's state is unknown: the runtime aborts the job (`fleet.runtime.waiting.abort_job`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from enum import Enum
from typing import Any

import numpy as np

HOST_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


class CollectiveState(Enum):
    """Where a collective is in its life; see the module docstring."""

    OPEN = "open"
    CLOSED = "closed"


class CollectiveError(RuntimeError):
    """A collective call failed for a reason other than a timeout, or was made after `close`."""


def check_host_array(buf: Any, what: str) -> np.ndarray:
    """Check that `buf` can be reduced in place: 1-D, contiguous, writable float32/float64."""
    ok = (
        isinstance(buf, np.ndarray)
        and buf.ndim == 1
        and buf.dtype in HOST_DTYPES
        and buf.flags.c_contiguous
        and buf.flags.writeable
    )
    if not ok:
        shown = f"{type(buf).__name__} {getattr(buf, 'dtype', '')} shape {getattr(buf, 'shape', '?')}"
        raise TypeError(f"{what}: expected a 1-D contiguous writable float32/float64 numpy array, got {shown}")
    return buf


def comm_label(comm: Any) -> str:
    """How messages name a group: the communicator's name when the runtime set one."""
    name = comm.Get_name()
    if name and not name.startswith("MPI_COMM_"):
        return f"group {name!r}"
    return f"a group of {comm.Get_size()} rank(s)"


class Collective(ABC):
    """Sums and broadcasts over one trainer group (see the module docstring for the contract).

    Attributes:
        name: the backend: ``mpi``, ``torch-gloo``, ``torch-nccl``, or ``solo`` (one member).
        label: how messages name the group, e.g. ``group 'resnet-003'``.
        timeout_s: the longest any call waits.
    """

    name: str

    def __init__(self, size: int, rank: int, timeout_s: float, label: str):
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        self._size, self._rank = int(size), int(rank)
        self.timeout_s = float(timeout_s)
        self.label = label
        self._state = CollectiveState.OPEN

    # -- the backend, as the registry sees it ------------------------------------------------

    @classmethod
    def backend_for(cls, device: str) -> str:
        """The name of the backend this class runs on `device` (its `name`, by default)."""
        return cls.name

    @classmethod
    def unavailable(cls, device: str) -> str | None:
        """Why this process cannot use the backend on `device`; None when it can."""
        return None

    @classmethod
    @abstractmethod
    def for_group(cls, group_comm: Any, device: str, timeout_s: float, label: str | None) -> "Collective":
        """This member's collective over `group_comm` for gradients on `device` (collective:
        every member calls it); `label` names the group in messages (None: the communicator's name)."""

    # -- identity ---------------------------------------------------------------------------

    @property
    def size(self) -> int:
        """Number of members of the group."""
        return self._size

    @property
    def rank(self) -> int:
        """This member's rank in the group (0 is the group master)."""
        return self._rank

    @property
    def state(self) -> CollectiveState:
        return self._state

    # -- primitives -------------------------------------------------------------------------

    @abstractmethod
    def allreduce_sum(self, buf: np.ndarray) -> None:
        """Replace `buf` (host array) by its sum over the group, in place."""

    @abstractmethod
    def broadcast(self, buf: np.ndarray, root: int = 0) -> None:
        """Overwrite `buf` (host array) on every member with the one of member `root`."""

    @abstractmethod
    def _release(self) -> None:
        """Free what the backend holds (called once, by `close`)."""

    # -- engine conveniences ----------------------------------------------------------------

    def allreduce_gradients(self, engine: Any) -> None:
        """Sum the engine's flat gradients over the group, in place, and load them back.

        This default goes through the host: on the CPU `flat_gradients()` is a view of the
        gradients, so nothing is copied; on a GPU it is a pinned host copy that
        `load_flat_gradients` copies back. Backends that reduce on the device override it.
        """
        flat = engine.flat_gradients()
        self.allreduce_sum(flat)
        engine.load_flat_gradients(flat)

    def broadcast_engine(self, engine: Any, root: int = 0) -> None:
        """Make every replica's parameters and floating-point buffers those of member `root`."""
        params = engine.flat_parameters()
        self.broadcast(params, root)
        buffers = engine.flat_buffers()
        if buffers.size:
            self.broadcast(buffers, root)
        if self.rank != root:
            engine.load_flat_parameters(params)
            if buffers.size:
                engine.load_flat_buffers(buffers)

    # -- life -------------------------------------------------------------------------------

    def close(self) -> None:
        """Release the backend's communicator, process group and sockets (idempotent)."""
        if self._state is CollectiveState.CLOSED:
            return
        self._state = CollectiveState.CLOSED
        self._release()

    def __enter__(self) -> "Collective":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    # -- helpers for implementations --------------------------------------------------------

    def _what(self, op: str) -> str:
        """An operation's description for messages: ``allreduce_sum in group 'x' (mpi, rank 1 of 4)``."""
        return f"{op} in {self.label} ({self.name}, rank {self.rank} of {self.size})"

    def _check_open(self, op: str) -> None:
        if self._state is not CollectiveState.OPEN:
            raise CollectiveError(f"{self._what(op)}: the collective is closed")

    def _check_root(self, root: int, op: str) -> None:
        if not 0 <= root < self.size:
            raise ValueError(f"{self._what(op)}: root {root} is not a member (size {self.size})")
