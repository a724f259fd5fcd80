"""Collective backends: how the members of a trainer group sum gradients and share weights.

`Collective` (in `_base.py`) is the contract. Backends are registered by name in
`COLLECTIVES`, imported only when a group uses them, and the spec's ``runtime.collective``
takes its valid names (`kinds()`) from here:

- ``horovod``: Horovod started over the group's communicator, NCCL inside it on CUDA where
  it was built with it (`HorovodCollective`; built by `make horovod`);
- ``torch``: a torch.distributed process group over exactly the group's members, gloo on
  the CPU and NCCL on CUDA (`TorchCollective`);
- ``mpi``: mpi4py's non-blocking collectives on flat host buffers (`MPICollective`);
- ``auto``: the first of `AUTO_ORDER` that this process can use on the device;
- a group of one member gets `SoloCollective`, whatever the kind.

This module is the registry only (importing it, as the spec does for the valid names,
imports no backend); `factory.py` picks and builds a group's backend.

Adding a backend: a module here with a `Collective` subclass (its `backend_for`,
`unavailable` and `for_group` say what the registry needs), one entry in `COLLECTIVES`,
and its place in `AUTO_ORDER`.
"""

from __future__ import annotations

from fleet.registry import Registry

COLLECTIVES: Registry[type] = Registry("collective", {
    "mpi": "fleet.runtime.train.collectives.mpi:MPICollective",
    "torch": "fleet.runtime.train.collectives.torch_dist:TorchCollective",
    "horovod": "fleet.runtime.train.collectives.horovod:HorovodCollective",
})
AUTO = "auto"
AUTO_ORDER = ("horovod", "torch", "mpi")  # the first this process can use; mpi is always there


def kinds() -> tuple[str, ...]:
    """The valid values of ``runtime.collective``: ``auto`` and every registered backend."""
    return (AUTO, *COLLECTIVES.names)
