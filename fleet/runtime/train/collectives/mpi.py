"""`MPICollective`: sums and broadcasts with mpi4py's non-blocking collectives on host buffers."""

from __future__ import annotations

from typing import Any

import numpy as np

from fleet.runtime.train.collectives._base import Collective, check_host_array, comm_label
from fleet.runtime.train.collectives._comm import dup_comm
from fleet.runtime.waiting import wait_request

# Arrays past this size wait for every member in a polled `Ibarrier` (polled as this process
# polls: `fleet.runtime.waiting.use_busy_polling`) and then move in a blocking call, which spins
# only while the data moves: Open MPI advances a non-blocking collective only inside MPI_Test,
# one shared-memory piece at a time, with its own slower algorithms (16 cores, 4 ranks, 64 MB:
# Iallreduce polled without sleeping 0.57x a blocking Allreduce, with sleeps 0.09x). Open MPI
# binds each of 2 ranks to a core, Slurm binds tasks to their CPUs: ranks that poll with sleeps
# are common, not only on oversubscribed nodes.
BLOCKING_BYTES = 64 << 10


class MPICollective(Collective):
    """`Iallreduce` / `Ibcast` on a duplicate of the group's communicator, polled; large
    arrays wait for every member in a polled `Ibarrier` and then move in a blocking
    `Allreduce` / `Bcast` (see `BLOCKING_BYTES`).

    Gradients go through the host (the base class's `allreduce_gradients`): on the CPU the
    engine's `flat_gradients()` is a view of the gradients and is reduced where it lies; on a
    GPU it is a pinned host copy, loaded back afterwards. (A CUDA-aware MPI could reduce the
    device buffer directly; that path is not taken yet.)

    Args:
        group_comm: the group's communicator (rank 0 is the master); duplicated here, so the
            caller keeps and frees its own.
        timeout_s: the longest any call waits before raising `WaitTimeout`.
        label: how messages name the group; defaults to the communicator's name.
    """

    name = "mpi"

    def __init__(self, group_comm: Any, timeout_s: float, label: str | None = None):
        label = label or comm_label(group_comm)
        comm = dup_comm(group_comm, f"duplicating the communicator of {label}", timeout_s)
        super().__init__(comm.Get_size(), comm.Get_rank(), timeout_s, label)
        self._comm = comm

    @classmethod
    def for_group(cls, group_comm: Any, device: str, timeout_s: float, label: str | None) -> "MPICollective":
        return cls(group_comm, timeout_s, label)  # host buffers on any device

    def allreduce_sum(self, buf: np.ndarray) -> None:
        self._check_open("allreduce_sum")
        check_host_array(buf, self._what("allreduce_sum"))
        from mpi4py import MPI

        what = self._what(f"allreduce_sum of {buf.size} {buf.dtype}")
        if self._all_arrived(buf, what):
            self._comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
            return
        wait_request(self._comm.Iallreduce(MPI.IN_PLACE, buf, op=MPI.SUM), what, self.timeout_s)

    def broadcast(self, buf: np.ndarray, root: int = 0) -> None:
        self._check_open("broadcast")
        check_host_array(buf, self._what("broadcast"))
        self._check_root(root, "broadcast")
        what = self._what(f"broadcast of {buf.size} {buf.dtype} from rank {root}")
        if self._all_arrived(buf, what):
            self._comm.Bcast(buf, root=root)
            return
        wait_request(self._comm.Ibcast(buf, root=root), what, self.timeout_s)

    def _all_arrived(self, buf: np.ndarray, what: str) -> bool:
        """For a large array: wait (polled, bounded) until every member has called, and say
        True, so that the transfer can block; else False."""
        if buf.nbytes <= BLOCKING_BYTES:
            return False
        wait_request(self._comm.Ibarrier(), f"{what}: the other members to arrive", self.timeout_s)
        return True

    def _release(self) -> None:
        self._comm.Free()  # local in practice; operations still pending (after a timeout) finish or die with the job
