"""`TorchCollective`: a torch.distributed process group (gloo or NCCL) over one trainer group.

The process group is built directly from a store, this rank's group rank and the group size,
with no default (world) group and no `init_process_group` / `new_group`, which would need
every rank of the job. The group master opens the store, tells the members where it is over
the group's communicator (non-blocking, polled), and the members open it too:

    members on several nodes (a TCP store; the OS picks the port):
        master:  store = TCPStore(host, 0, None, True, timeout, wait_for_workers=False)
                 port = store.port
        members: store = TCPStore(host, port, None, False, timeout)
    members on one node (a file store in a private node-local directory, see below):
        all:     store = FileStore(path, size)
    then all:    prefix = PrefixStore("fleet/torch-gloo/", store)
        gloo:    options = ProcessGroupGloo._Options()
                 options._devices = [ProcessGroupGloo.create_device(hostname=address, lazy_init=False)]
                 options._timeout, options._threads = timeout, 1
                 pg = ProcessGroupGloo(prefix, rank, size, options)
        nccl:    options = ProcessGroupNCCL.Options(); options._timeout = timeout
                 pg = ProcessGroupNCCL(prefix, rank, size, options)

Why a file store on one node: torch's socket layer names every TCP connection it opens with
a reverse DNS lookup (`getnameinfo` without `NI_NUMERICHOST`, pytorch issue 159007); the
loopback address in its IPv4-mapped form is in no hosts file, so each connection asks the
name server, and where that one drops a query the connection waits out the resolver's 5 s
timeout (measured: 5-15 % of TCP stores on a workstation). A file store opens no socket.
``store="tcp"`` forces the TCP store everywhere.

Gloo needs the store only while its members connect: once all have (a barrier), the master
removes the file store's directory, so a job that dies later leaves nothing behind. NCCL
keeps using the store (it exchanges its unique id at the first collective), so its file
stays until `close`. `close` waits for every member, shuts the backend down, drops the store
(a TCP store's sockets and thread go with it), waits again so that no member still holds the
file, and removes the directory.
"""

from __future__ import annotations

import datetime
import time
from typing import Any, Callable

import numpy as np
import torch
import torch.distributed as dist

from fleet.runtime.train.collectives._base import Collective, CollectiveError, check_host_array, comm_label
from fleet.runtime.train.collectives._comm import all_on_one_host, barrier, dup_comm, node_address
from fleet.runtime.train.collectives._stores import STORE_KINDS, GroupStore, one_line
from fleet.runtime.waiting import WaitTimeout, poll

LOOPBACK = "127.0.0.1"


def backend_for(device: torch.device) -> str:
    """``nccl`` for CUDA devices, ``gloo`` for the CPU."""
    return "nccl" if device.type == "cuda" else "gloo"


def gloo_device(address: str) -> Any:
    """A gloo TCP device bound to `address`, connecting eagerly (torch < 2.6 has no `lazy_init`)."""
    try:
        return dist.ProcessGroupGloo.create_device(hostname=address, lazy_init=False)
    except TypeError:
        return dist.ProcessGroupGloo.create_device(hostname=address)


class TorchCollective(Collective):
    """Sums and broadcasts with `ProcessGroupGloo` (CPU) or `ProcessGroupNCCL` (CUDA).

    Gradients are reduced where they live: a torch engine's `gradient_buffer()` in place on the
    device (any other engine's through the host). Host arrays (the control vector, `broadcast`)
    are wrapped without a copy for gloo, and copied to the GPU and back for NCCL.

    Waiting: gloo's `Work.wait(timeout)` sleeps on a condition variable (no spinning, measured)
    and gloo also fails the operation itself at the timeout, so its worker thread is freed.
    NCCL's work is polled (`is_completed`, a CUDA event query) with sleeps.

    Args:
        group_comm: the group's communicator (rank 0 is the master); duplicated here.
        device: ``cpu`` (gloo) or ``cuda[:i]`` (NCCL), the device the engine's gradients live on.
        timeout_s: the longest any call (the construction included) waits.
        label: how messages name the group; defaults to the communicator's name.
        host: this rank's address as the other members can reach it; by default the loopback
            address when all members share a node, else `node_address()`.
        store: ``auto`` (a file store when all members share a node, else TCP), ``file`` or
            ``tcp``; see the module docstring.
    """

    name = "torch"  # the instance says which: torch-gloo or torch-nccl

    def __init__(
        self,
        group_comm: Any,
        device: str = "cpu",
        timeout_s: float = 300.0,
        label: str | None = None,
        host: str | None = None,
        store: str = "auto",
    ):
        if store not in STORE_KINDS:
            raise ValueError(f"store {store!r}: expected one of {', '.join(STORE_KINDS)}")
        self._device = torch.device(device)
        self.name = f"torch-{backend_for(self._device)}"
        label = label or comm_label(group_comm)
        comm = dup_comm(group_comm, f"duplicating the communicator of {label}", timeout_s)
        super().__init__(comm.Get_size(), comm.Get_rank(), timeout_s, label)
        self._comm = comm
        self._store = self._pg = None
        try:
            one_host = all_on_one_host(comm, self._what("finding the members' nodes"), timeout_s)
            address = host or (LOOPBACK if one_host else node_address())
            kind = store if store != "auto" else ("file" if one_host else "tcp")
            self._store = self._guarded(
                lambda: GroupStore(comm, kind, address, timeout_s, self._what(f"opening the {kind} store")),
                f"opening the {kind} store",
            )
            prefix = dist.PrefixStore(f"fleet/{self.name}/", self._store.store)
            self._pg = self._guarded(lambda: self._new_group(prefix, address), f"building the {self.name} group")
            if self.name == "torch-gloo":  # gloo is done with the store once every member has connected
                barrier(comm, self._what("the other members to connect"), timeout_s)
                self._store.remove_files()
        except BaseException:
            self._drop()
            raise

    # -- the backend, as the registry sees it ------------------------------------------------

    @classmethod
    def backend_for(cls, device: str) -> str:
        return f"torch-{backend_for(torch.device(device))}"

    @classmethod
    def unavailable(cls, device: str) -> str | None:
        name = backend_for(torch.device(device))
        built_in = dist.is_available() and (dist.is_nccl_available() if name == "nccl" else dist.is_gloo_available())
        return None if built_in else f"this torch build has no {name} backend for device {device!r}"

    @classmethod
    def for_group(cls, group_comm: Any, device: str, timeout_s: float, label: str | None) -> "TorchCollective":
        return cls(group_comm, device, timeout_s, label)

    # -- construction -----------------------------------------------------------------------

    @property
    def _timeout(self) -> datetime.timedelta:
        return datetime.timedelta(seconds=self.timeout_s)

    def _new_group(self, store: dist.PrefixStore, address: str) -> Any:
        if self.name == "torch-nccl":
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = self._timeout
            options.is_high_priority_stream = False
            return dist.ProcessGroupNCCL(store, self.rank, self.size, options)
        options = dist.ProcessGroupGloo._Options()
        options._devices = [gloo_device(address)]
        options._timeout = self._timeout
        options._threads = 1  # one operation in flight at a time; fewer threads on busy cores
        return dist.ProcessGroupGloo(store, self.rank, self.size, options)

    def _guarded(self, make: Callable[[], Any], op: str) -> Any:
        """Run a blocking torch constructor; turn its failures into our two errors."""
        start = time.monotonic()
        try:
            return make()
        except (RuntimeError, OSError) as exc:  # DistError, DistStoreError, TimeoutError...
            if isinstance(exc, CollectiveError):
                raise
            self._raise_failure(exc, op, start)

    def _raise_failure(self, exc: BaseException, op: str, start: float) -> None:
        message = one_line(exc)
        timed_out = "timed out" in message.lower() or "timeout" in message.lower()
        if timed_out or time.monotonic() - start >= self.timeout_s:
            waited = f"timed out after {self.timeout_s:g} s waiting for {self._what(op)}"
            raise WaitTimeout(f"{waited} ({message})") from None
        raise CollectiveError(f"{self._what(op)} failed: {message}") from None

    # -- collectives ------------------------------------------------------------------------

    def allreduce_sum(self, buf: np.ndarray) -> None:
        self._check_open("allreduce_sum")
        check_host_array(buf, self._what("allreduce_sum"))
        tensor = self._on_device(buf)
        self._allreduce(tensor, f"allreduce_sum of {buf.size} {buf.dtype}")
        self._back_to_host(tensor, buf)

    def allreduce_gradients(self, engine: Any) -> None:
        self._check_open("allreduce_gradients")
        grads = engine.gradient_buffer()
        if not isinstance(grads, torch.Tensor) or grads.device.type != self._device.type:
            super().allreduce_gradients(engine)  # another framework's buffer, or another device: through the host
            return
        self._allreduce(grads, f"allreduce_gradients of {grads.numel()} {grads.dtype}")
        engine.load_flat_gradients(grads)  # a no-op: grads is the engine's own buffer

    def broadcast(self, buf: np.ndarray, root: int = 0) -> None:
        self._check_open("broadcast")
        check_host_array(buf, self._what("broadcast"))
        self._check_root(root, "broadcast")
        tensor = self._on_device(buf)
        options = dist.BroadcastOptions()
        options.rootRank, options.rootTensor, options.timeout = root, 0, self._timeout
        self._wait(self._pg.broadcast([tensor], options), f"broadcast of {buf.size} {buf.dtype} from rank {root}")
        self._back_to_host(tensor, buf)

    def _allreduce(self, tensor: torch.Tensor, op: str) -> None:
        options = dist.AllreduceOptions()
        options.reduceOp, options.timeout = dist.ReduceOp.SUM, self._timeout
        self._wait(self._pg.allreduce([tensor], options), op)

    def _wait(self, work: Any, op: str) -> None:
        """Wait for one operation without spinning; raise `WaitTimeout` at the deadline."""
        start = time.monotonic()
        try:
            if self.name == "torch-nccl":
                poll(work.is_completed, self._what(op), self.timeout_s)
                work.wait()  # orders the current stream after the collective; raises if it failed
            elif not work.wait(self._timeout):
                raise WaitTimeout(f"timed out after {self.timeout_s:g} s waiting for {self._what(op)}")
        except (RuntimeError, OSError) as exc:  # gloo's timeout, a lost peer, NCCL's error
            if isinstance(exc, CollectiveError):
                raise
            self._raise_failure(exc, op, start)

    def _on_device(self, buf: np.ndarray) -> torch.Tensor:
        tensor = torch.from_numpy(buf)  # shares the memory
        return tensor if self._device.type == "cpu" else tensor.to(self._device)

    def _back_to_host(self, tensor: torch.Tensor, buf: np.ndarray) -> None:
        if self._device.type != "cpu":
            torch.from_numpy(buf).copy_(tensor)  # synchronous device-to-host copy

    # -- life -------------------------------------------------------------------------------

    def _release(self) -> None:
        try:
            barrier(self._comm, self._what("closing: the other members to close"), self.timeout_s)
            self._drop_group()
            barrier(self._comm, self._what("closing: the other members to let go of the store"), self.timeout_s)
        finally:
            self._drop()

    def _drop_group(self) -> None:
        """Shut the backend down and let go of the store (idempotent)."""
        if self._pg is not None:
            try:
                getattr(self._pg, "shutdown", lambda: None)()  # torch >= 2.4 has it
            except RuntimeError:
                pass  # already broken: dropping it is all that is left
            self._pg = None
        if self._store is not None:
            self._store.drop_store()

    def _drop(self) -> None:
        """Drop the process group, the store and its directory, and free the communicator."""
        self._drop_group()
        if self._store is not None:
            self._store.close()
            self._store = None
        self._comm.Free()
