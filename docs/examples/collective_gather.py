"""Example: a collective backend, "gather" (sum at the group master, then broadcast).

A backend is (see docs/architecture.md, "Adding a collective"):
1. a `Collective` subclass (the contract is in `fleet/runtime/train/collectives/_base.py`:
   every call collective, in place, waits that sleep and time out, `close` frees all);
2. its class methods `backend_for`, `unavailable` and `for_group`, which the registry uses;
3. one entry in `fleet.runtime.train.collectives.COLLECTIVES` (and, to be chosen by
   ``auto``, a place in `AUTO_ORDER`); the spec's `runtime.collective` then accepts it.

Run under ``mpiexec -n N python docs/examples/collective_gather.py``: every rank checks a sum.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fleet.runtime.train.collectives._base import Collective, check_host_array, comm_label
from fleet.runtime.train.collectives._comm import dup_comm
from fleet.runtime.waiting import wait_request


class GatherCollective(Collective):
    """Sums by a reduce to the master and a broadcast back: two steps where an allreduce takes
    one, but the master holds the sum first (a place to check or log it)."""

    name = "gather"

    def __init__(self, group_comm: Any, timeout_s: float, label: str | None = None):
        label = label or comm_label(group_comm)
        comm = dup_comm(group_comm, f"duplicating the communicator of {label}", timeout_s)
        super().__init__(comm.Get_size(), comm.Get_rank(), timeout_s, label)
        self.comm = comm

    @classmethod
    def for_group(cls, group_comm: Any, device: str, timeout_s: float, label: str | None) -> "GatherCollective":
        return cls(group_comm, timeout_s, label)

    @classmethod
    def unavailable(cls, device: str) -> str | None:
        return None if not str(device).startswith("cuda") else "gather sums host arrays only"

    def allreduce_sum(self, buf: np.ndarray) -> None:
        self._check_open("allreduce_sum")
        check_host_array(buf, self._what("allreduce_sum"))
        from mpi4py import MPI  # initialises MPI; the runtime has by the time a group exists

        total = np.empty_like(buf) if self.rank == 0 else None
        wait_request(self.comm.Ireduce(buf, total, op=MPI.SUM, root=0), self._what("reduce"), self.timeout_s)
        if self.rank == 0:
            buf[...] = total
        wait_request(self.comm.Ibcast(buf, root=0), self._what("broadcast of the sum"), self.timeout_s)

    def broadcast(self, buf: np.ndarray, root: int = 0) -> None:
        self._check_open("broadcast")
        check_host_array(buf, self._what("broadcast"))
        self._check_root(root, "broadcast")
        wait_request(self.comm.Ibcast(buf, root=root), self._what("broadcast"), self.timeout_s)

    def _release(self) -> None:
        self.comm.Free()


if __name__ == "__main__":
    from mpi4py import MPI  # initialises MPI: this file run as a script under mpiexec

    with GatherCollective(MPI.COMM_WORLD, timeout_s=30.0) as collective:
        values = np.full(5, float(collective.rank + 1))
        collective.allreduce_sum(values)
        expected = collective.size * (collective.size + 1) / 2
        assert np.all(values == expected), (values, expected)
        print(f"rank {collective.rank}: sum {values[0]:g} ok", flush=True)
