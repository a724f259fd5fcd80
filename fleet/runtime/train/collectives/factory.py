"""Which collective backend a trainer group uses, and building it (see the registry in `__init__`)."""

from __future__ import annotations

from typing import Any

from fleet.errors import UserError
from fleet.runtime.train import collectives as registry
from fleet.runtime.train.collectives._base import Collective
from fleet.runtime.train.collectives.mpi import MPICollective
from fleet.runtime.train.collectives.solo import SoloCollective



def _load(kind: str) -> type[Collective] | None:
    """The backend class of `kind`; None when its module (or its framework) cannot be imported."""
    try:
        return registry.COLLECTIVES.load(kind)
    except ImportError:
        return None


def _gradients_device(device: str) -> str:
    """Where a group's gradients live: the device itself, and the host (``cpu``) for the
    emulated device, whose engines keep numpy arrays."""
    return "cpu" if device == "emulated" else device


def _backend_class(kind: str, device: str) -> type[Collective]:
    """The class that `kind` means on `device` (raises `UserError`, see `resolve_backend`)."""
    device = _gradients_device(device)
    if kind not in registry.kinds():
        raise UserError(f"collective {kind!r}: expected one of {', '.join(registry.kinds())}")
    if kind == registry.AUTO:
        usable = (cls for cls in map(_load, registry.AUTO_ORDER) if cls is not None and cls.unavailable(device) is None)
        return next(usable, MPICollective)
    backend = _load(kind)
    why = "cannot import it here" if backend is None else backend.unavailable(device)
    if why is not None:
        raise UserError(f"collective {kind!r}: {why}; use 'mpi'")
    return backend


def available_backends() -> list[str]:
    """The backend names (``mpi``, ``torch-gloo``, ``torch-nccl``, ...) this process can use."""
    names: list[str] = []
    for cls in filter(None, map(_load, registry.COLLECTIVES.names)):
        names += [cls.backend_for(device) for device in ("cpu", "cuda") if cls.unavailable(device) is None]
    return list(dict.fromkeys(names))


def resolve_backend(kind: str, device: str) -> str:
    """The backend name that `kind` means on `device` (e.g. ``auto`` on ``cpu``: ``torch-gloo``;
    ``emulated`` counts as ``cpu``).

    Raises:
        UserError: unknown kind, or a backend this process cannot use on the device.
    """
    return _backend_class(kind, device).backend_for(_gradients_device(device))


def create_collective(
    kind: str, group_comm: Any, device: str, timeout_s: float, label: str | None = None
) -> Collective:
    """The collective of one trainer group, for this member (collective over `group_comm`).

    Args:
        kind: one of the registry's `kinds()` (see its docstring).
        group_comm: the group's communicator, rank 0 the master; the collective duplicates it.
        device: the device the engine's gradients live on (``cpu``, ``cuda:0``, ...; ``emulated``
            is the host's).
        timeout_s: the longest any call of the collective waits.
        label: how messages name the group (default: the communicator's name).

    Raises:
        UserError: see `resolve_backend`.
    """
    backend = _backend_class(kind, device)
    if group_comm.Get_size() == 1:
        backend = SoloCollective
    return backend.for_group(group_comm, _gradients_device(device), timeout_s, label)
