"""The rendezvous store of one torch process group: opened by the master, shared with the members.

See `torch_dist` for why members on one node share a `FileStore` and members on several
nodes a `TCPStore`. The master broadcasts where the store is as one short text:
``file:<path>`` or ``tcp:<host>:<port>``, or ``!<problem>`` when it could not open one.
"""

from __future__ import annotations

import datetime
import os
import shutil
import tempfile
from typing import Any

import torch.distributed as dist

from fleet.runtime.train.collectives._base import CollectiveError
from fleet.runtime.train.collectives._comm import broadcast_text

STORE_KINDS = ("auto", "file", "tcp")
FAILED = "!"


def node_local_dir() -> str:
    """Where a node's file stores go: /dev/shm when it is usable, else the temp directory."""
    shm = "/dev/shm"
    if os.path.isdir(shm) and os.access(shm, os.W_OK | os.X_OK):
        return shm
    return tempfile.gettempdir()


def one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:400]


class GroupStore:
    """A store shared by the members of `comm` (collective: every member constructs it).

    Args:
        comm: the group's communicator; rank 0 opens the store and says where it is.
        kind: ``file`` (members on one node) or ``tcp``.
        address: for ``tcp``, the master's address as the members can reach it.
        timeout_s: the longest a store operation (or the announcement) waits.
        what: how messages name the step (``opening the store of group 'x' (rank 1 of 4)``).

    Raises:
        CollectiveError: the master could not open the store (every member raises).
        WaitTimeout: the announcement did not come in time.
        RuntimeError: torch could not open or reach the store (callers translate it).
    """

    def __init__(self, comm: Any, kind: str, address: str, timeout_s: float, what: str):
        self.store: Any = None
        self._directory: str | None = None
        timeout = datetime.timedelta(seconds=timeout_s)
        size = comm.Get_size()
        if comm.Get_rank() == 0:
            where = self._open_master(kind, address, size, timeout)
            broadcast_text(comm, where, 0, what, timeout_s)
            if where.startswith(FAILED):
                raise CollectiveError(f"{what}: {where[1:]}")
            return
        where = broadcast_text(comm, None, 0, what, timeout_s)
        if where.startswith(FAILED):
            raise CollectiveError(f"{what}: the group master could not open it: {where[1:]}")
        scheme, _, rest = where.partition(":")
        if scheme == "file":
            self.store = dist.FileStore(rest, size)
            self.store.set_timeout(timeout)
        else:
            host, _, port = rest.rpartition(":")
            self.store = dist.TCPStore(host, int(port), None, False, timeout)

    def _open_master(self, kind: str, address: str, size: int, timeout: datetime.timedelta) -> str:
        """Open the store on the master; returns what to announce."""
        try:
            if kind == "file":
                self._directory = tempfile.mkdtemp(prefix="fleet-pg-", dir=node_local_dir())
                path = os.path.join(self._directory, "store")
                self.store = dist.FileStore(path, size)
                self.store.set_timeout(timeout)
                return f"file:{path}"
            self.store = dist.TCPStore(address, 0, None, True, timeout, wait_for_workers=False)
            return f"tcp:{address}:{self.store.port}"
        except (RuntimeError, ValueError, OSError) as exc:
            self.close()
            return FAILED + one_line(exc)

    def remove_files(self) -> None:
        """Remove the master's file store directory now (members keep their store objects).

        Safe once nobody will use the store again: a file store's destructor skips a file
        that is gone. A job that dies later then leaves nothing behind.
        """
        if self._directory is not None:
            shutil.rmtree(self._directory, ignore_errors=True)
            self._directory = None

    def drop_store(self) -> None:
        """Let go of the store (a TCP server's sockets and thread go with it)."""
        self.store = None

    def close(self) -> None:
        """Drop the store and the master's directory.

        Members must have dropped their file stores first: a file store's destructor
        re-opens its file, and waits (up to the store's timeout) for a missing one to appear.
        """
        self.store = None
        self.remove_files()
