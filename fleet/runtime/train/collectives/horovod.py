"""`HorovodCollective`: Horovod's allreduce and broadcast over one trainer group.

Horovod is started once per group, over the group's own communicator, and shut down when
the group dissolves: ``hvd.init(comm=<a duplicate of the group's communicator>)`` ...
``hvd.shutdown()``. A trainer belongs to one group at a time, so one Horovod instance per
process is all a group needs, and nothing involves ranks outside the group, as the collective
contract asks. The other ways were measured against this one and rejected:

- process sets (``hvd.add_process_set``) are collective over *every* Horovod rank, but fleet's
  groups form and dissolve independently (a converged model frees its trainers while the
  other groups train on), so every trainer would have to stop at once to register a set;
- pre-registering every node-local set cannot cover groups across nodes, and a job of 8
  trainers per node already has 247 node-local subsets.

Calls are asynchronous (``allreduce_async_`` / ``broadcast_async_`` in place on a tensor that
shares the host array's memory) and polled with sleeps, so a wait ends at ``timeout_s`` and
the trainer's thread spins no core. Every call is named by its kind, type and size (see `_run`).

Horovod's background thread negotiates with the other members every cycle
(``HOROVOD_CYCLE_TIME``, 1 ms by default), and as released an operation waits for the next
cycle. `make horovod` patches the thread to wake when an operation is enqueued and to sleep
finely (tools/horovod-wake.h; 2 ranks on the VM: a 1 MB allreduce 1.8-2x faster), and this
side polls with a fine timer slack too (`waiting.fine_sleeps`). A negotiation still costs a
few collective round trips, which a gradient of megabytes hides and a control message of a
few numbers does not. So arrays up to `SMALL_BYTES` (the trainers' per-step control vector, their
decisions and sums) go over the group's own communicator with MPI, and gradients, weights
and every larger array through Horovod. Its negotiation is made of blocking MPI calls, which
spin a core under MPICH; `make horovod` builds it with those calls waiting in sleeps instead
(tools/horovod-nospin.h: an idle member costs about 3% of a core, not 56-73%) where ranks share
cores, and its allreduces and broadcasts of more than 64 KiB waiting in a sleeping barrier for
every member and then moving in the blocking call (a sleeping wait on the transfer itself
would move one shared-memory piece per sleep); where each rank has cores to itself
(`fleet.runtime.waiting.use_busy_polling`), every call stays blocking.

On CUDA, Horovod must be built with NCCL (``HOROVOD_GPU_OPERATIONS=NCCL``): it reduces a torch
engine's gradient buffer on the device (host arrays, like the control vector, stay on the host).
"""

from __future__ import annotations

import os
import re
import sys
from typing import Any

import numpy as np

from fleet.runtime.train.collectives._base import Collective, CollectiveError, check_host_array, comm_label
from fleet.runtime.train.collectives._comm import barrier, dup_comm
from fleet.runtime import waiting
from fleet.runtime.waiting import Backoff, poll, wait_request

try:  # an optional dependency, built by `make horovod`
    import horovod.torch as hvd
    import torch
    from horovod.common.exceptions import HorovodInternalError
except ImportError as exc:  # also: built without PyTorch
    hvd, HorovodInternalError, IMPORT_ERROR = None, RuntimeError, (str(exc).splitlines() or [repr(exc)])[0]
else:
    IMPORT_ERROR = None

BUILD_HINT = "build it into this environment with `make horovod` (tools/build-horovod.sh; see docs/cluster.md, Horovod)"
SMALL_BYTES = 64 << 10  # arrays up to this size go over MPI (see the module docstring)
WAIT = Backoff(20e-6, 250e-6)  # an operation takes a cycle or more: poll it finely, never spin
_LIBMPI = re.compile(r"/libmpi(_abi)?\.so[.\d]*$")


def mapped_mpi_libraries() -> set[str]:
    """The MPI libraries (``libmpi.so*``) mapped into this process, by real path (Linux)."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split(None, 5)[-1].strip() for line in maps if "libmpi" in line}
    except OSError:
        return set()
    return {os.path.realpath(path) for path in paths if _LIBMPI.search(path)}


class HorovodCollective(Collective):
    """Sums and broadcasts with Horovod over a duplicate of the group's communicator.

    Args:
        group_comm: the group's communicator (rank 0 is the master); duplicated here, and
            Horovod duplicates it again for its own traffic.
        device: the device the engine's gradients live on (``cpu``, ``cuda[:i]``).
        timeout_s: the longest any call waits.
        label: how messages name the group; defaults to the communicator's name.
    """

    name = "horovod"

    def __init__(self, group_comm: Any, device: str = "cpu", timeout_s: float = 300.0, label: str | None = None):
        why = self.unavailable(device)
        if why is not None:
            raise CollectiveError(f"collective 'horovod': {why}")
        self.name = self.backend_for(device)
        label = label or comm_label(group_comm)
        comm = dup_comm(group_comm, f"duplicating the communicator of {label}", timeout_s)
        super().__init__(comm.Get_size(), comm.Get_rank(), timeout_s, label)
        self._comm, self._device_type = comm, "cuda" if device.startswith("cuda") else "cpu"
        if hvd.is_initialized():
            comm.Free()
            raise CollectiveError(f"{self._what('starting Horovod')}: Horovod already runs another group in this process")
        try:
            hvd.init(comm=comm)  # every member got here: the duplicate above was their rendezvous
        except BaseException:
            comm.Free()
            raise

    # -- the backend, as the registry sees it ------------------------------------------------

    @classmethod
    def backend_for(cls, device: str) -> str:
        return "horovod-nccl" if device.startswith("cuda") else "horovod"

    @classmethod
    def unavailable(cls, device: str) -> str | None:
        if hvd is None:
            return f"Horovod with PyTorch cannot be imported here ({IMPORT_ERROR}); {BUILD_HINT}"
        if not hvd.mpi_built():
            return f"this Horovod was built without MPI; {BUILD_HINT}"
        if device.startswith("cuda") and not hvd.nccl_built():
            return f"this Horovod was built without NCCL for CUDA tensors; {BUILD_HINT} with HOROVOD_GPU_OPERATIONS=NCCL"
        if "mpi4py.MPI" in sys.modules:  # both MPI libraries are loaded by now: compare them
            libraries = mapped_mpi_libraries()
            if len(libraries) > 1:
                return f"Horovod and mpi4py use different MPI libraries ({', '.join(sorted(libraries))}); {BUILD_HINT} against mpi4py's MPI"
        return None

    @classmethod
    def for_group(cls, group_comm: Any, device: str, timeout_s: float, label: str | None) -> "HorovodCollective":
        return cls(group_comm, device, timeout_s, label)

    # -- collectives ------------------------------------------------------------------------

    def allreduce_sum(self, buf: np.ndarray) -> None:
        self._check_open("allreduce_sum")
        check_host_array(buf, self._what("allreduce_sum"))
        what = f"allreduce_sum of {buf.size} {buf.dtype}"
        if buf.nbytes <= SMALL_BYTES:
            from mpi4py import MPI

            wait_request(self._comm.Iallreduce(MPI.IN_PLACE, buf, op=MPI.SUM), self._what(what), self.timeout_s)
            return
        tensor = torch.from_numpy(buf)  # shares the memory
        self._run(lambda name: hvd.allreduce_async_(tensor, op=hvd.Sum, name=name), what, f"sum.{buf.dtype}.{buf.size}")

    def allreduce_gradients(self, engine: Any) -> None:
        self._check_open("allreduce_gradients")
        grads = engine.gradient_buffer()
        if not isinstance(grads, torch.Tensor) or grads.device.type != self._device_type:
            super().allreduce_gradients(engine)  # another framework's buffer: through the host
            return
        what = f"allreduce_gradients of {grads.numel()} {grads.dtype}"
        self._run(lambda name: hvd.allreduce_async_(grads, op=hvd.Sum, name=name), what, f"sum.{grads.dtype}.{grads.numel()}")
        engine.load_flat_gradients(grads)  # a no-op: grads is the engine's own buffer

    def broadcast(self, buf: np.ndarray, root: int = 0) -> None:
        self._check_open("broadcast")
        check_host_array(buf, self._what("broadcast"))
        self._check_root(root, "broadcast")
        if buf.nbytes <= SMALL_BYTES:
            what = self._what(f"broadcast of {buf.size} {buf.dtype} from rank {root}")
            wait_request(self._comm.Ibcast(buf, root=root), what, self.timeout_s)
            return
        tensor = torch.from_numpy(buf)
        what = f"broadcast of {buf.size} {buf.dtype} from rank {root}"
        self._run(lambda name: hvd.broadcast_async_(tensor, root_rank=root, name=name), what, f"bcast.{root}.{buf.dtype}.{buf.size}")

    def _run(self, start: Any, op: str, key: str) -> None:
        """Start one operation, named `key`, and wait for it without spinning.

        Horovod matches operations across members by name, and its default names count the
        calls of the whole process (members that came from different groups differ). One
        operation is in flight at a time, so a name of its kind, type and size is unique, and
        repeating it lets Horovod's response cache skip most of the negotiation.
        """
        what = self._what(op)
        waiting.fine_sleeps()
        try:
            handle = start(f"fleet.{key}")
            poll(lambda: hvd.poll(handle), what, self.timeout_s, waiting.BUSY if waiting.HOT is waiting.BUSY else WAIT)
            hvd.synchronize(handle)
        except (HorovodInternalError, RuntimeError, ValueError) as exc:
            raise CollectiveError(f"{what} failed: {str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__}") from None

    # -- life -------------------------------------------------------------------------------

    def _release(self) -> None:
        try:
            barrier(self._comm, self._what("closing: the other members to finish"), self.timeout_s)
        finally:
            hvd.shutdown()  # also ends the members' background threads, which is why the barrier comes first
            self._comm.Free()

