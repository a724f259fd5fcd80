"""Waiting without spinning, and never forever.

MPI's blocking calls busy-poll (MPICH spins a core while it waits), which starves
oversubscribed ranks. Every wait in the runtime therefore polls a non-blocking test with
short sleeps that grow from `Backoff.first_s` to `Backoff.max_s`, and gives up at a deadline
with a `WaitTimeout` that names what it waited for. `abort_job` turns that into one line on
stderr and ends every rank of the job.

Data-plane waits (`HOT`) also spin for `spin_s` before each sleep: MPI moves a large
message between processes of a node in small shared-memory pieces, and each piece needs
both sides to call into MPI, so a sleeping receiver slows a transfer to one piece per sleep
(MPICH on 2 cores: 7k samples/s sleeping, 35k-150k spinning 50 us; Open MPI on 16 cores:
9k against 269k for a blocking broadcast). Where every rank has cores to itself, data waits
poll without sleeping (`BUSY`, yielding the GIL between bursts) as MPI's own waits do;
`use_busy_polling` chooses, from `runtime.poll` and the node's cores.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from fleet.host import node_cores

T = TypeVar("T")


class WaitTimeout(Exception):
    """A wait passed its deadline; the message says what was awaited."""


@dataclass(frozen=True)
class Backoff:
    """Schedule of a polling loop: poll for `spin_s`, then sleep `first_s`, doubled after
    each miss up to `max_s`."""

    first_s: float = 20e-6
    max_s: float = 2e-3
    spin_s: float = 0.0

    def sleeps(self):
        delay = self.first_s
        while True:
            yield delay
            delay = min(delay * 2, self.max_s)


SHARING = Backoff(20e-6, 2e-3, spin_s=50e-6)  # data waits where ranks share cores
BUSY = Backoff(0.0, 0.0, spin_s=50e-6)  # data waits where each rank has cores: poll, yield, poll
IDLE = Backoff(1e-3, 20e-3)  # commands and heartbeats: CPU matters
HOT = SHARING  # the data plane's schedule; `use_busy_polling` switches it for this process


def use_busy_polling(busy: bool) -> None:
    """Choose how this process waits for data: `BUSY` where it has cores to itself (MPI's
    large transfers then move at full speed), `SHARING` where ranks outnumber cores. Horovod's
    waits follow (``FLEET_MPI_WAIT``, read by the patch of tools/horovod-nospin.h)."""
    global HOT
    HOT = BUSY if busy else SHARING
    os.environ["FLEET_MPI_WAIT"] = "busy" if busy else "sleep"


_PR_SET_TIMERSLACK = 29
_fine = threading.local()


def fine_sleeps() -> None:
    """Let the calling thread's short sleeps end on time. Linux lets a sleep overrun by the
    thread's timer slack, 50 us by default, so a 20 us sleep of a backoff takes about 70 us;
    this sets the slack to 1 us (once per thread; elsewhere than Linux it does nothing)."""
    if getattr(_fine, "done", False):
        return
    _fine.done = True
    try:
        ctypes.CDLL(None).prctl(_PR_SET_TIMERSLACK, 1000, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def polling_threads(trainers: int, preprocessors: int, own_decoding: bool) -> int:
    """Threads on a node that poll: a trainer's stream and training threads (and its own
    decoder's, where its models decode their own data), a preprocessor's loop."""
    return (3 if own_decoding else 2) * trainers + preprocessors


def busy_polling_fits(threads_on_node: int) -> bool:
    """True when the cores this process may run on (its affinity: a Slurm job's cgroup, a
    launcher's binding) number at least the node's polling threads. A rank bound to cores of
    its own is not told apart from ranks sharing one cgroup of as many cores: both poll with
    sleeps unless the node's threads fit (`runtime.poll: busy` overrides)."""
    return threads_on_node <= node_cores()


class WaitBooks:
    """The seconds a process's threads waited in polls of one kind and the CPU seconds the
    polling took meanwhile (`poll`'s `books`): what a waiting rank costs its node's cores."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.seconds = 0.0
        self.cpu_s = 0.0

    def add(self, seconds: float, cpu_s: float) -> None:
        with self._lock:
            self.seconds += seconds
            self.cpu_s += cpu_s

    def totals(self) -> tuple[float, float]:
        """(seconds, CPU seconds) so far."""
        with self._lock:
            return self.seconds, self.cpu_s

    def since(self, earlier: tuple[float, float]) -> tuple[float, float]:
        """(seconds, CPU seconds) since `earlier` (a `totals`)."""
        seconds, cpu_s = self.totals()
        return seconds - earlier[0], cpu_s - earlier[1]


DATA_WAITS = WaitBooks()
"""This process's waits for data in its stream threads (a trainer's: chunks, shares, room in
its group's sends)."""


def poll(test: Callable[[], T | None], what: str, timeout_s: float, backoff: Backoff | None = None,
         books: WaitBooks | None = None) -> T:
    """Call `test()` until it returns something other than None/False; return that. Where
    `test` fails at first, the wait's seconds and the polling thread's CPU seconds go to `books`.

    Raises:
        WaitTimeout: `timeout_s` passed first; the message is ``timed out after N s waiting for <what>``.
    """
    if books is not None:
        result = test()
        if result is not None and result is not False:
            return result
        began, cpu_began = time.monotonic(), time.thread_time()
        try:
            return poll(test, what, timeout_s, backoff)
        finally:
            books.add(time.monotonic() - began, time.thread_time() - cpu_began)
    backoff = backoff or HOT
    deadline = time.monotonic() + timeout_s
    for delay in backoff.sleeps():
        spin_until = time.perf_counter() + backoff.spin_s
        while True:
            result = test()
            if result is not None and result is not False:
                return result
            if time.perf_counter() >= spin_until:
                break
        if time.monotonic() > deadline:
            raise WaitTimeout(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(delay)
    raise AssertionError("unreachable")


def wait_request(request: Any, what: str, timeout_s: float, backoff: Backoff | None = None) -> Any:
    """Wait for one MPI request (`Test` polling); returns its status object."""
    from mpi4py import MPI

    status = MPI.Status()
    poll(lambda: request.Test(status), what, timeout_s, backoff)
    return status


def wait_requests(requests: list, what: str, timeout_s: float, backoff: Backoff | None = None) -> None:
    """Wait for every MPI request of `requests`."""
    if requests:
        poll(lambda: all_done(requests), what, timeout_s, backoff)


def all_done(requests: list) -> bool:
    """True when every MPI request of `requests` has completed (`Testall`; True for none)."""
    from mpi4py import MPI

    return not requests or MPI.Request.Testall(requests)


def recv_object(comm: Any, source: int, tag: int, what: str, timeout_s: float, backoff: Backoff = IDLE) -> Any:
    """Receive one pickled message (any size) from `source` with `tag`, without spinning."""
    message = poll(lambda: comm.improbe(source=source, tag=tag), what, timeout_s, backoff)
    return message.recv()


@dataclass
class RankIdentity:
    """How a rank names itself in messages: ``rank 5 (trainer, node 1)``; `error_log` is
    where `abort_job` also appends its line (the run directory's ``fleet-errors.log``)."""

    rank: int
    role: str = "starting"
    node: int | None = None
    error_log: str | None = None

    def __str__(self) -> str:
        where = f", node {self.node}" if self.node is not None else ""
        return f"rank {self.rank} ({self.role}{where})"


_abort_lock = threading.Lock()


ABORT_GRACE_S = 0.5  # lets the launcher forward the line before MPI_Abort tears the job down


def abort_job(world: Any, who: RankIdentity, message: str, code: int = 3) -> None:
    """Print one line naming this rank and the problem, then end every rank of the job."""
    with _abort_lock:
        line = f"fleet: {who}: {message}"
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
        if who.error_log:
            try:
                with open(who.error_log, "a", encoding="utf-8") as log:
                    log.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {line}\n")
            except OSError:
                pass
        time.sleep(ABORT_GRACE_S)
        try:
            world.Abort(code)
        finally:
            os._exit(code)


def send_object(comm: Any, obj: Any, dest: int, tag: int, what: str, timeout_s: float) -> None:
    """Send a small pickled message without spinning (`isend` + polling)."""
    wait_request(comm.isend(obj, dest=dest, tag=tag), what, timeout_s, IDLE)


def bcast_object(comm: Any, obj: Any, root: int, what: str, timeout_s: float) -> Any:
    """Broadcast a picklable object from `root` without spinning (length, then bytes)."""
    import pickle

    import numpy as np

    data = pickle.dumps(obj) if comm.rank == root else b""
    size = np.array([len(data)], dtype=np.int64)
    wait_request(comm.Ibcast(size, root=root), f"{what} (size)", timeout_s, IDLE)
    buffer = np.frombuffer(data, dtype=np.uint8).copy() if comm.rank == root else np.empty(int(size[0]), np.uint8)
    wait_request(comm.Ibcast(buffer, root=root), what, timeout_s, IDLE)
    return obj if comm.rank == root else pickle.loads(buffer.tobytes())


def barrier(comm: Any, what: str, timeout_s: float) -> None:
    """A barrier that sleeps while it waits."""
    wait_request(comm.Ibarrier(), what, timeout_s, IDLE)
