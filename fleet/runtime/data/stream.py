"""A trainer group's side of a stream, in a thread of its own beside the training loop.

The master thread (`MasterStream`) keeps receives posted for the chunks its paired
preprocessors send it (its Qp) and passes each of those on to the stream's other masters;
it receives every other chunk from the master that holds it (the chunk's root); and it hands
the group its shares: its own into its Qt, the workers' by synchronous sends
(`fleet.runtime.data.shares`). A worker thread (`WorkerShares`) moves its shares into its Qt.
How the chunks travel between preprocessors and masters, and through shared memory:
`fleet.runtime.data.transport`.

When the group leaves (converged, or checkpointed), the master stops forwarding, tells its
workers, and keeps taking its chunks until the switch chunk of the regroup that removes it.
A hollow chunk (a header alone: the stream's newest layout has no master) also ends the
forwarding, since no member trains past it.
No chunk at or past the stream's `end` (its layout's) comes: a master that gets there waits
for the coordinator's next regroup, which removes it or moves the end
(`fleet.runtime.data.layouts`). Each thread owns the communicator it is given (a Dup of the
group's) and frees it.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np

from fleet.runtime import waiting
from fleet.runtime.data.chunks import HEADER_WORDS, ChunkLayout, Field, Flag
from fleet.runtime.data.layouts import LayoutHistory, Version, regroup_box
from fleet.runtime.data.queues import SampleQueue, Share
from fleet.runtime.data.shares import SHARE_TAG, GroupSends, MemberClock, ShareForwarding
from fleet.runtime.data.shm import Claim, claim_of
from fleet.runtime.data.transport import ChunkFanout, ChunkReceives, SlotClaims
from fleet.runtime.protocol import Regroup, StartMember
from fleet.runtime.waiting import WaitTimeout, poll


class StreamThread(threading.Thread):
    """Base of the two stream threads: error capture and the leave request."""

    def __init__(self, name: str, qt: SampleQueue):
        super().__init__(name=name, daemon=True)
        self.qt = qt
        self.error: BaseException | None = None
        self.leave_requested = threading.Event()
        self.waiting_for: str | None = None  # what this thread's current wait is for, if any

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

    def describe(self) -> str:
        """Where this thread is, for the message of a wait on its queue that timed out."""
        return f"its stream thread waits for {self.waiting_for}" if self.waiting_for else "its stream thread is not waiting"

    def _poll(self, test, what: str, backoff=None):
        self.waiting_for = what
        try:
            return poll(test, what, self.ctx.timeout_s, backoff, books=waiting.DATA_WAITS)
        finally:
            self.waiting_for = None


class MasterStream(StreamThread):
    """The master's stream thread: takes the stream's chunks in order (`ChunkReceives`),
    passes those it is root of on to the other masters (`ChunkFanout`), hands each to its
    group (`ShareForwarding`), and applies the coordinator's regroups to what it knows of the
    stream (`LayoutHistory`) and to its receives, until a layout no longer has it as a master
    (see the module docstring). Started by the group's `GroupTraining` on its master rank;
    after the group leaves, the trainer loop keeps it as a draining thread until it ends.
    """

    def __init__(self, ctx, start: StartMember, group_comm: Any, qt: SampleQueue, clock: MemberClock):
        super().__init__(f"stream-{start.layout.stream}", qt)
        self.ctx, self.group_comm = ctx, group_comm
        self.rank, self.stream, self.k = ctx.rank, start.layout.stream, start.first_chunk
        self.chunks = ChunkLayout(start.source.chunk_samples, ctx.input_shape)
        self.layouts = LayoutHistory(self.rank, start.first_chunk, start.layout)
        pool = ctx.pool
        self.claims = SlotClaims(pool)
        qp_chunks = max(1, ctx.spec.runtime.qp_samples // start.source.chunk_samples)
        self.receives = ChunkReceives(ctx.data_parent, self.stream, self.rank, self.chunks, qp_chunks, pool,
                                      ctx.timeout_s)
        self.fanout = ChunkFanout(ctx.data_parent, self.stream, self.rank, self.chunks, pool, self._wait)
        in_place = [pool is not None and pool.is_local(r) for r in start.ranks]  # by group rank
        window = max(2, ctx.spec.runtime.qt_samples // start.source.chunk_samples)
        sends = GroupSends(group_comm, window, in_place, pool, start.ranks, self._wait)
        self.shares = ShareForwarding(self.chunks, clock, qt, sends, self.claims, self.leave_requested, ctx.timeout_s)
        self.regroups = regroup_box(ctx)

    # -- the loop ----------------------------------------------------------------------

    def stream_loop(self) -> None:
        while True:
            version = self.layouts.at(self.k)
            if self.rank not in version.layout.masters:
                return
            if self.layouts.at_end(self.k):
                # every member's last chunk is taken: the regroup that removes this master,
                # or the join that moves the end, comes from the coordinator
                if not self.layouts.stays():
                    return
                self._take_regroups(block_for=self.layouts.newest.version + 1, backoff=waiting.IDLE)
                continue
            self.claims.release_ready()
            self.receives.post_qp(self.k, self.layouts)
            self.receives.post_inbox(self.k, self.layouts)
            data, claim = self._take_chunk(version)
            notice = int(self.chunks.header(data)[Field.REGROUP_VERSION])
            if notice > self.layouts.newest.version and self.layouts.stays():
                self._take_regroups(block_for=notice)
            self.shares.forward(self.k, data, claim)
            self.k += 1

    def _take_chunk(self, version: Version) -> tuple[np.ndarray, Claim | None]:
        """Chunk `k`: from its preprocessor and on to the other masters (root), or from its
        root; its bytes, and the claim on its slot when it is read in shared memory."""
        layout, chunk = version.layout, self.k
        buffer = self.receives.take(chunk, layout, self._wait)
        data, claim = self.receives.open(buffer)
        if layout.owner(chunk) == self.rank:
            self.fanout.pass_on(layout, chunk, buffer, data, claim)
        return data, claim

    def _wait(self, test, what: str, backoff=None):
        """Poll `test` (see `waiting.poll`), releasing the slots this thread is done with meanwhile."""
        def step():
            self.claims.release_ready()
            return test()

        where = f"at chunk {self.k}, layout version {self.layouts.newest.version}"
        return self._poll(step, f"{what} ({where})", backoff)

    # -- regroups -----------------------------------------------------------------------

    def _take_regroups(self, block_for: int, backoff=None) -> None:
        """Apply the coordinator's Regroup commands up to version `block_for`.

        A chunk's header names the newest regroup its preprocessor knew of, and a switch is
        always past such a chunk, so a master that is still in the stream learns of every
        regroup before it has to act on it; a master that has learnt it is leaving needs
        no more of them (and is sent none), so it stops at the regroup that removes it."""
        while self.layouts.newest.version < block_for and self.layouts.stays():
            what = f"regroup {block_for} of stream {self.stream} from the coordinator"
            newest = self.layouts.newest.version
            self._apply(self._wait(lambda: self.regroups.after(self.stream, newest), what, backoff or waiting.HOT))

    def _apply(self, command: Regroup) -> None:
        self.layouts.add(command.switch_chunk, command.layout)
        self.receives.regroup(command.switch_chunk, command.layout)

    def cleanup(self) -> None:
        try:
            if self.shares.active and self.error is None:
                self.shares.stop(self.k)
            self.receives.close()
            self.fanout.finish(self.ctx.timeout_s)
            self.shares.finish(self.ctx.timeout_s)
            self.claims.release_all(wait=self.error is None, timeout_s=self.ctx.timeout_s)
        finally:
            self.group_comm.Free()


class WorkerShares(StreamThread):
    """A worker's stream thread: its master's shares into its Qt, until LEAVE."""

    def __init__(self, ctx, start: StartMember, group_comm: Any, qt: SampleQueue):
        super().__init__(f"shares-{start.layout.stream}", qt)
        self.ctx, self.group_comm = ctx, group_comm
        self.chunks = ChunkLayout(start.source.chunk_samples, ctx.input_shape)

    def _receive(self, buffer: np.ndarray) -> np.ndarray:
        """The next message of the share protocol (header and labels, or rows), into `buffer`."""
        message = self._poll(lambda: self.group_comm.Improbe(source=0, tag=SHARE_TAG), "a share from the group's master")
        message.Recv(buffer)
        return buffer

    def stream_loop(self) -> None:
        while True:
            head = self._receive(np.empty(HEADER_WORDS + self.chunks.capacity, np.int64))
            flags, count = int(head[Field.FLAGS]), int(head[Field.COUNT])
            if flags & Flag.LEAVE:
                return
            y = head[HEADER_WORDS : HEADER_WORDS + count]
            claim = claim_of(head)
            if claim is not None:  # the rows are in a slot on this node: copy them out, release it
                pool = self.ctx.pool
                pool.sync()
                start = int(head[Field.SHARE_START])
                x = self.chunks.images(pool.view(claim))[start : start + count].copy()
                pool.release(claim)
            else:
                x = np.empty((count, *self.chunks.sample_shape), np.float32)
                if count:  # an empty share (fewer rows than the group has trainers) has no rows message
                    self._receive(x)
            if not self.leave_requested.is_set():
                share = Share(x, y, int(head[Field.INDEX]), epoch_end=bool(flags & Flag.EPOCH_END))
                self.qt.put(share, self.ctx.timeout_s)

    def cleanup(self) -> None:
        self.group_comm.Free()


def wait_thread(thread: threading.Thread, what: str, timeout_s: float) -> None:
    """Join a thread, giving up at the deadline."""
    deadline = time.monotonic() + timeout_s
    while thread.is_alive():
        thread.join(timeout=min(1.0, max(0.0, deadline - time.monotonic())))
        if time.monotonic() > deadline and thread.is_alive():

            raise WaitTimeout(f"timed out after {timeout_s:g} s waiting for {what}")
