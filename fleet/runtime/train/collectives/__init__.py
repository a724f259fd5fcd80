"""Collective backends: how the members of a trainer group sum gradients and share weights.

`Collective` (in `_base.py`) is the contract. Backends are registered by name in
`COLLECTIVES`, imported only when a group uses them, and the spec's ``runtime.collective``
takes its valid names (`KINDS`) from here:

- ``torch``: a torch.distributed process group over exactly the group's members, gloo on
  the CPU and NCCL on CUDA (`TorchCollective`);
- ``mpi``: mpi4py's non-blocking collectives on flat host buffers (`MPICollective`);
- ``auto``: the first of `AUTO_ORDER` that this process can use on the device;
- a group of one member gets `SoloCollective`, whatever the kind.

Adding a backend: a module here with a `Collective` subclass (its `backend_for`,
`unavailable` and `for_group` say what the registry needs), one entry in `COLLECTIVES`,
and its place in `AUTO_ORDER`.
"""

from __future__ import annotations

from typing import Any

from fleet.errors import UserError
from fleet.registry import Registry
from fleet.runtime.train.collectives._base import Collective, CollectiveError, CollectiveState
from fleet.runtime.train.collectives.mpi import MPICollective
from fleet.runtime.train.collectives.solo import SoloCollective

COLLECTIVES: Registry[type[Collective]] = Registry("collective", {
    "mpi": "fleet.runtime.train.collectives.mpi:MPICollective",
    "torch": "fleet.runtime.train.collectives.torch_dist:TorchCollective",
    # "horovod": "fleet.runtime.train.collectives.horovod:HorovodCollective",  (process sets; a later issue)
})
AUTO = "auto"
AUTO_ORDER = ("torch", "mpi")  # Horovod goes first when it lands; mpi is always there
KINDS = (AUTO, *COLLECTIVES.names)


def _load(kind: str) -> type[Collective] | None:
    """The backend class of `kind`; None when its module (or its framework) cannot be imported."""
    try:
        return COLLECTIVES.load(kind)
    except ImportError:
        return None


def _backend_class(kind: str, device: str) -> type[Collective]:
    """The class that `kind` means on `device` (raises `UserError`, see `resolve_backend`)."""
    if kind not in KINDS:
        raise UserError(f"collective {kind!r}: expected one of {', '.join(KINDS)}")
    if kind == AUTO:
        usable = (cls for cls in map(_load, AUTO_ORDER) if cls is not None and cls.unavailable(device) is None)
        return next(usable, MPICollective)
    backend = _load(kind)
    why = "cannot import it here" if backend is None else backend.unavailable(device)
    if why is not None:
        raise UserError(f"collective {kind!r}: {why}; use 'mpi'")
    return backend


def available_backends() -> list[str]:
    """The backend names (``mpi``, ``torch-gloo``, ``torch-nccl``, ...) this process can use."""
    names: list[str] = []
    for cls in filter(None, map(_load, COLLECTIVES.names)):
        names += [cls.backend_for(device) for device in ("cpu", "cuda") if cls.unavailable(device) is None]
    return list(dict.fromkeys(names))


def resolve_backend(kind: str, device: str) -> str:
    """The backend name that `kind` means on `device` (e.g. ``auto`` on ``cpu``: ``torch-gloo``).

    Raises:
        UserError: unknown kind, or a backend this process cannot use on the device.
    """
    return _backend_class(kind, device).backend_for(device)


def create_collective(
    kind: str, group_comm: Any, device: str, timeout_s: float, label: str | None = None
) -> Collective:
    """The collective of one trainer group, for this member (collective over `group_comm`).

    Args:
        kind: one of `KINDS` (see the module docstring).
        group_comm: the group's communicator, rank 0 the master; the collective duplicates it.
        device: the device the engine's gradients live on (``cpu``, ``cuda:0``, ...).
        timeout_s: the longest any call of the collective waits.
        label: how messages name the group (default: the communicator's name).

    Raises:
        UserError: see `resolve_backend`.
    """
    backend = _backend_class(kind, device)
    if group_comm.Get_size() == 1:
        backend = SoloCollective
    return backend.for_group(group_comm, device, timeout_s, label)


__all__ = [
    "AUTO",
    "AUTO_ORDER",
    "COLLECTIVES",
    "KINDS",
    "Collective",
    "CollectiveError",
    "CollectiveState",
    "MPICollective",
    "SoloCollective",
    "available_backends",
    "create_collective",
    "resolve_backend",
]
