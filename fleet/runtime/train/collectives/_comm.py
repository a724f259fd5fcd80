"""MPI steps the backends share, each non-blocking and polled (MPICH's blocking calls spin)."""

from __future__ import annotations

import socket
from typing import Any

import numpy as np

from fleet.runtime.waiting import wait_request

TEXT_BYTES = 320  # a host name or address, a port, and room to spare


def dup_comm(comm: Any, what: str, timeout_s: float) -> Any:
    """A duplicate of `comm` that the caller owns (and frees)."""
    new_comm, request = comm.Idup()
    wait_request(request, what, timeout_s)
    return new_comm


def barrier(comm: Any, what: str, timeout_s: float) -> None:
    """Wait until every member of `comm` has arrived here."""
    wait_request(comm.Ibarrier(), what, timeout_s)


def broadcast_text(comm: Any, text: str | None, root: int, what: str, timeout_s: float) -> str:
    """Send a short text from `root` to every member (`text` is ignored elsewhere)."""
    buf = np.zeros(TEXT_BYTES, np.uint8)
    if comm.Get_rank() == root:
        raw = (text or "").encode()[: TEXT_BYTES - 1]
        buf[: len(raw)] = np.frombuffer(raw, np.uint8)
    wait_request(comm.Ibcast(buf, root=root), what, timeout_s)
    return buf.tobytes().rstrip(b"\0").decode(errors="replace")


def all_on_one_host(comm: Any, what: str, timeout_s: float) -> bool:
    """Whether every member of `comm` runs on the node this rank runs on."""
    from mpi4py import MPI

    mine = np.zeros(TEXT_BYTES, np.uint8)
    raw = MPI.Get_processor_name().encode()[: TEXT_BYTES - 1]
    mine[: len(raw)] = np.frombuffer(raw, np.uint8)
    names = np.zeros((comm.Get_size(), TEXT_BYTES), np.uint8)
    wait_request(comm.Iallgather(mine, names), what, timeout_s)
    return bool((names == mine).all())


def node_address() -> str:
    """An IPv4 address of this node that other nodes can reach (not a loopback one).

    The host name's addresses first (Debian-like systems map it to 127.0.1.1, which is
    skipped), then the address of the interface that holds the default route (a UDP
    `connect` sends nothing), and the host name itself as a last resort.
    """
    name = socket.gethostname()
    try:
        for *_, sockaddr in socket.getaddrinfo(name, None, socket.AF_INET, socket.SOCK_STREAM):
            if not sockaddr[0].startswith("127."):
                return sockaddr[0]
    except OSError:
        pass
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("10.255.255.255", 1))
            address = probe.getsockname()[0]
            if not address.startswith(("127.", "0.")):
                return address
    except OSError:
        pass
    return name
