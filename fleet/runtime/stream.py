"""A trainer group's side of a stream, in a thread of its own beside the training loop.

The master thread (`MasterStream`) keeps receives posted for the chunks its paired
preprocessors send it (its Qp), takes part in the masters' broadcast of every chunk of the
stream (as root for its own chunks), and hands the group its shares: its own into its Qt,
the workers' by synchronous sends (so a slow worker slows the stream instead of filling
memory). A worker thread (`WorkerShares`) moves its shares into its Qt.

When the group leaves (converged, or checkpointed), the master stops forwarding, tells its
workers, and keeps taking part in the broadcast until the switch chunk of the regroup that
removes it. Each thread owns the communicator it is given (a Dup of the group's) and frees it.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np
from mpi4py import MPI

from fleet.runtime.chunks import ChunkLayout, Field, Flag, chunk_tag, share_bounds, write_header
from fleet.runtime.protocol import Regroup, StartMember, StreamLayout, stream_tag
from fleet.runtime.queues import SampleQueue, Share
from fleet.runtime.waiting import HOT, poll, recv_object, wait_request

SHARE_TAG = 31
LOCKSTEP_CHUNKS = 4
"""Masters meet at a barrier every this many chunks. A broadcast root does not wait for the
other masters (small chunks go out eagerly and pile up in MPI's buffers), so without it a
fast member could run arbitrarily far ahead of the stream's slowest member."""


class MemberClock:
    """A member's own epochs: an epoch ends at the chunk that completes `samples_per_epoch`."""

    def __init__(self, samples_per_epoch: int, done: int = 0):
        self.samples_per_epoch, self.done = samples_per_epoch, done

    def consume(self, count: int) -> bool:
        self.done += count
        if self.done >= self.samples_per_epoch:
            self.done = 0
            return True
        return False


def create_masters_comm(parent: Any, layout: StreamLayout) -> Any:
    """The masters' communicator of one layout version (collective over its masters only)."""
    group = parent.Get_group().Incl(list(layout.masters))
    try:
        return parent.Create_group(group, tag=layout.comm_tag)
    finally:
        group.Free()


@dataclass
class Version:
    first: int
    layout: StreamLayout
    comm: Any = None


class StreamThread(threading.Thread):
    """Base of the two stream threads: error capture and the leave request."""

    def __init__(self, name: str, qt: SampleQueue):
        super().__init__(name=name, daemon=True)
        self.qt = qt
        self.error: BaseException | None = None
        self.leave_requested = threading.Event()

    def run(self) -> None:
        try:
            self.stream_loop()
        except BaseException as exc:  # the training thread re-raises it
            self.error = exc
        finally:
            self.qt.close()
            self.cleanup()

    def stream_loop(self) -> None:
        raise NotImplementedError

    def cleanup(self) -> None:
        pass

    def request_leave(self) -> None:
        self.leave_requested.set()


class MasterStream(StreamThread):
    """The master's stream thread (see the module docstring)."""

    def __init__(self, ctx, start: StartMember, group_comm: Any, qt: SampleQueue, clock: MemberClock):
        super().__init__(f"stream-{start.layout.stream}", qt)
        self.ctx, self.start_cmd, self.group_comm, self.clock = ctx, start, group_comm, clock
        self.chunks = ChunkLayout(start.source.chunk_samples, ctx.input_shape)
        self.stream = start.layout.stream
        self.k = start.first_chunk
        self.versions: list[Version] = []
        self.qp: dict[int, tuple[Any, np.ndarray]] = {}
        self.qp_chunks = max(1, ctx.spec.runtime.qp_samples // start.source.chunk_samples)
        self.pool: list[np.ndarray] = []
        self.sends: deque = deque()
        self.send_window = max(2, ctx.spec.runtime.qt_samples // start.source.chunk_samples)
        self.forwarding = True
        self.chunks_done = 0

    # -- the loop ----------------------------------------------------------------------

    def stream_loop(self) -> None:
        self._add_version(self.k, self.start_cmd.layout)
        while True:
            self._take_regroups(block_for=None)
            version = self._version_at(self.k)
            if self.ctx.rank not in version.layout.masters:
                return
            if version.comm is None:
                version.comm = create_masters_comm(self.ctx.data_parent, version.layout)
            self._post_qp()
            buffer = self._broadcast(version)
            notice = int(self.chunks.header(buffer)[Field.REGROUP_VERSION])
            if notice > self.versions[-1].layout.version and self._stays():
                self._take_regroups(block_for=notice)
            self._forward(buffer)
            self.pool.append(buffer)
            self.k += 1
            self.chunks_done += 1
            if self.k % LOCKSTEP_CHUNKS == 0:
                what = f"the other masters of stream {self.stream} to reach chunk {self.k}"
                wait_request(version.comm.Ibarrier(), what, self.ctx.timeout_s)

    def _stays(self) -> bool:
        """True while the newest layout this thread knows still has it as a master: only then
        do later regroups concern it (a leaving master is not sent them)."""
        return self.ctx.rank in self.versions[-1].layout.masters

    def _version_at(self, chunk: int) -> Version:
        return [v for v in self.versions if v.first <= chunk][-1]

    def _add_version(self, first: int, layout: StreamLayout) -> None:
        """Record a layout; its communicator is created at its first chunk (see `stream_loop`):
        creating it earlier could block this thread while another master still waits for a
        chunk of the old layout that this thread is the root of."""
        self.versions.append(Version(first, layout, None))

    def _buffer(self) -> np.ndarray:
        return self.pool.pop() if self.pool else self.chunks.new_buffer()

    # -- Qp: receives from the paired preprocessors -----------------------------------

    def _post_qp(self) -> None:
        posted, chunk, limit = len(self.qp), self.k, self.k + 4 * self.qp_chunks * 8
        while posted < self.qp_chunks and chunk < limit:
            layout = self._version_at(chunk).layout
            if chunk not in self.qp and layout.masters and layout.owner(chunk) == self.ctx.rank:
                source = layout.preprocessors[chunk % len(layout.preprocessors)]
                buffer = self._buffer()
                request = self.ctx.data_parent.Irecv(buffer, source=source, tag=chunk_tag(self.stream, chunk))
                self.qp[chunk] = (request, buffer)
                posted += 1
            chunk += 1

    def _cancel_qp(self, keep=lambda chunk: False) -> None:
        for chunk in [c for c in self.qp if not keep(c)]:
            request, buffer = self.qp.pop(chunk)
            request.Cancel()
            wait_request(request, f"cancelling the receive of chunk {chunk}", self.ctx.timeout_s)
            self.pool.append(buffer)

    # -- the masters' broadcast ---------------------------------------------------------

    def _broadcast(self, version: Version) -> np.ndarray:
        layout, chunk = version.layout, self.k
        root = layout.masters.index(layout.owner(chunk))
        timeout = self.ctx.timeout_s
        if layout.owner(chunk) == self.ctx.rank:
            request, buffer = self.qp.pop(chunk)
            source = layout.preprocessors[chunk % len(layout.preprocessors)]
            wait_request(request, f"chunk {chunk} of stream {self.stream} from preprocessor rank {source}", timeout)
        else:
            buffer = self._buffer()
        request = version.comm.Ibcast(buffer, root=root)
        wait_request(request, f"the broadcast of chunk {chunk} of stream {self.stream} from master rank {layout.masters[root]}", timeout)
        return buffer

    # -- regroups -----------------------------------------------------------------------

    def _take_regroups(self, block_for: int | None) -> None:
        """Apply Regroup commands from the coordinator; with `block_for`, wait for that version."""
        tag = stream_tag(self.stream)
        while True:
            newest = self.versions[-1].layout.version
            if block_for is not None and newest < block_for:
                what = f"regroup {block_for} of stream {self.stream} from the coordinator"
                command = recv_object(self.ctx.ctrl, 0, tag, what, self.ctx.timeout_s, HOT)
            else:
                message = self.ctx.ctrl.improbe(source=0, tag=tag)
                if message is None:
                    return
                command = message.recv()
            if isinstance(command, Regroup) and command.layout.version > newest:
                self._apply(command)

    def _apply(self, command: Regroup) -> None:
        self._add_version(command.switch_chunk, command.layout)
        new = command.layout
        self._cancel_qp(keep=lambda c: c < command.switch_chunk or (bool(new.masters) and new.owner(c) == self.ctx.rank))

    # -- shares ---------------------------------------------------------------------------

    def _forward(self, buffer: np.ndarray) -> None:
        if not self.forwarding:
            return
        if self.leave_requested.is_set():
            self._stop_forwarding()
            return
        header = self.chunks.header(buffer)
        count = int(header[Field.COUNT])
        epoch_end = self.clock.consume(count)
        x, y = self.chunks.images(buffer), self.chunks.labels(buffer)
        bounds = share_bounds(count, self.group_comm.size)
        for worker, (lo, hi) in enumerate(bounds[1:], start=1):
            self._send_share(worker, int(header[Field.INDEX]), x[lo:hi], y[lo:hi], Flag.EPOCH_END if epoch_end else Flag.NONE)
        lo, hi = bounds[0]
        share = Share(x[lo:hi].copy(), y[lo:hi].copy(), int(header[Field.INDEX]), epoch_end=epoch_end)
        self.qt.put(share, self.ctx.timeout_s)

    def _send_share(self, worker: int, chunk: int, x: np.ndarray, y: np.ndarray, flags: int) -> None:
        while len(self.sends) >= self.send_window * max(1, self.group_comm.size - 1):
            request, buffer = self.sends.popleft()
            wait_request(request, f"worker {worker} of the group to take its share", self.ctx.timeout_s)
            self.pool.append(buffer)
        buffer = self._buffer()
        write_header(self.chunks.header(buffer), chunk, 0, len(y), flags)
        if len(y):
            self.chunks.images(buffer)[: len(y)] = x
            self.chunks.labels(buffer)[: len(y)] = y
        request = self.group_comm.Issend(buffer[: self.chunks.used_bytes(len(y))], dest=worker, tag=SHARE_TAG)
        self.sends.append((request, buffer))

    def _stop_forwarding(self) -> None:
        """The group leaves: tell the workers, then only take part in the broadcast."""
        self.forwarding = False
        for worker in range(1, self.group_comm.size):
            self._send_share(worker, self.k, np.empty((0,)), np.empty(0, np.int64), Flag.LEAVE)
        self.qt.close()

    def cleanup(self) -> None:
        try:
            if self.forwarding and self.error is None:
                self._stop_forwarding()
            self._cancel_qp()
            for request, _ in self.sends:
                wait_request(request, "the group's workers to take their last shares", self.ctx.timeout_s)
        finally:
            for version in self.versions:
                if version.comm is not None:
                    version.comm.Free()
            self.group_comm.Free()


class WorkerShares(StreamThread):
    """A worker's stream thread: its master's shares into its Qt, until LEAVE."""

    def __init__(self, ctx, start: StartMember, group_comm: Any, qt: SampleQueue):
        super().__init__(f"shares-{start.layout.stream}", qt)
        self.ctx, self.group_comm = ctx, group_comm
        self.chunks = ChunkLayout(start.source.chunk_samples, ctx.input_shape)
        self.buffer = self.chunks.new_buffer()

    def stream_loop(self) -> None:
        status = MPI.Status()
        while True:
            message = poll(
                lambda: self.group_comm.Improbe(source=0, tag=SHARE_TAG),
                "a share from the group's master", self.ctx.timeout_s, HOT,
            )
            message.Recv(self.buffer, status=status)
            header = self.chunks.header(self.buffer)
            flags, count = int(header[Field.FLAGS]), int(header[Field.COUNT])
            if flags & Flag.LEAVE:
                return
            if self.leave_requested.is_set():
                continue
            x = self.chunks.images(self.buffer)[:count].copy()
            y = self.chunks.labels(self.buffer)[:count].copy()
            self.qt.put(Share(x, y, int(header[Field.INDEX]), epoch_end=bool(flags & Flag.EPOCH_END)), self.ctx.timeout_s)

    def cleanup(self) -> None:
        self.group_comm.Free()


def wait_thread(thread: threading.Thread, what: str, timeout_s: float) -> None:
    """Join a thread, giving up at the deadline."""
    deadline = time.monotonic() + timeout_s
    while thread.is_alive():
        thread.join(timeout=min(1.0, max(0.0, deadline - time.monotonic())))
        if time.monotonic() > deadline and thread.is_alive():
            from fleet.runtime.waiting import WaitTimeout

            raise WaitTimeout(f"timed out after {timeout_s:g} s waiting for {what}")
