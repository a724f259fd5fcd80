"""Collective backends: how the members of a trainer group sum gradients and share weights.

`Collective` (in `_base.py`) is the contract. `create_collective` picks a backend per group:

- ``torch``: a torch.distributed process group over exactly the group's members, gloo on
  the CPU and NCCL on CUDA (`TorchCollective`);
- ``mpi``: mpi4py's non-blocking collectives on flat host buffers (`MPICollective`);
- ``auto``: torch when its backend for the device is built in, else mpi;
- a group of one member gets `SoloCollective`, whatever the kind.
"""

from __future__ import annotations

from typing import Any

from fleet.errors import UserError
from fleet.runtime.train.collectives._base import Collective, CollectiveError, CollectiveState
from fleet.runtime.train.collectives.mpi import MPICollective
from fleet.runtime.train.collectives.solo import SoloCollective

KINDS = ("auto", "mpi", "torch")
BACKENDS = ("mpi", "torch-gloo", "torch-nccl")


def _is_cuda(device: str) -> bool:
    return str(device).startswith("cuda")


def _torch_backend_available(name: str) -> bool:
    """Whether this torch build has the process-group backend `name` (``torch-gloo``/``torch-nccl``)."""
    import torch.distributed as dist

    if not dist.is_available():
        return False
    return dist.is_nccl_available() if name == "torch-nccl" else dist.is_gloo_available()


def available_backends() -> list[str]:
    """The names of `BACKENDS` this process can use."""
    return ["mpi"] + [name for name in BACKENDS[1:] if _torch_backend_available(name)]


def resolve_backend(kind: str, device: str) -> str:
    """The backend name (one of `BACKENDS`) that `kind` means on `device`.

    Raises:
        UserError: unknown kind, or ``torch`` where this torch build lacks the device's backend.
    """
    if kind not in KINDS:
        raise UserError(f"collective {kind!r}: expected one of {', '.join(KINDS)}")
    if kind == "mpi":
        return "mpi"
    # Horovod (process sets) will plug in here, ahead of torch, for kind "auto" and "horovod".
    torch_name = "torch-nccl" if _is_cuda(device) else "torch-gloo"
    if _torch_backend_available(torch_name):
        return torch_name
    if kind == "torch":
        missing = torch_name.removeprefix("torch-")
        raise UserError(f"collective 'torch': this torch build has no {missing} backend for device {device!r}; "
                        "use 'mpi'")
    return "mpi"


def create_collective(
    kind: str, group_comm: Any, device: str, timeout_s: float, label: str | None = None
) -> Collective:
    """The collective of one trainer group, for this member (collective over `group_comm`).

    Args:
        kind: ``auto``, ``mpi`` or ``torch`` (see the module docstring).
        group_comm: the group's communicator, rank 0 the master; the collective duplicates it.
        device: the device the engine's gradients live on (``cpu``, ``cuda:0``, ...).
        timeout_s: the longest any call of the collective waits.
        label: how messages name the group (default: the communicator's name).

    Raises:
        UserError: see `resolve_backend`.
    """
    backend = resolve_backend(kind, device)
    if group_comm.Get_size() == 1:
        return SoloCollective(timeout_s, label or "a group of 1 rank")
    if backend == "mpi":
        return MPICollective(group_comm, timeout_s, label)
    from fleet.runtime.train.collectives.torch_dist import TorchCollective

    return TorchCollective(group_comm, device, timeout_s, label)


__all__ = [
    "BACKENDS",
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
