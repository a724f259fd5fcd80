"""A trainer group's side of a stream, in a thread of its own beside the training loop.

The master thread (`MasterStream`) keeps receives posted for the chunks its paired
preprocessors send it (its Qp) and passes each of those on to the stream's other masters;
it receives every other chunk from the master that holds it (the chunk's root); and it hands
the group its shares: its own into its Qt, the workers' by synchronous sends (so a slow
worker slows the stream instead of filling memory), two messages a share: the header with
the labels, then the rows. A worker thread (`WorkerShares`) moves
its shares into its Qt.

The masters' broadcast is point-to-point on purpose: a non-blocking collective advances only
while its ranks call into MPI, round by round (Open MPI's `Ibcast` of a 2 MB chunk, waited on
by sleep-polling, moved 45 MB/s on a 16-core node), where a synchronous send needs one
handshake. A root has at most `FANOUT_WINDOW` chunks in flight, so no master falls further
behind than that. No communicator is ever created for the data, so membership changes
cannot block on one.

When the group leaves (converged, or checkpointed), the master stops forwarding, tells its
workers, and keeps taking its chunks until the switch chunk of the regroup that removes it.
A hollow chunk (a header alone: the stream's newest layout has no master) also ends the
forwarding, since no member trains past it.
No chunk at or past the stream's `end` (its layout's) comes: a master that gets there waits
for the coordinator's next regroup, which removes it or moves the end. Each thread owns the
communicator it is given (a Dup of the group's) and frees it.

A chunk may come as a descriptor of a preprocessor's shared-memory slot (`fleet.runtime.data.shm`):
the master then reads it in place, passes the descriptor on to the masters of its node and
the bytes to the others, and copies its own share out. A worker on its node gets only its
share's header (a descriptor too, with the share's first row) and copies its rows out of the
slot itself, then writes the ticket into its own cell of the slot's row; one on another node
gets the rows from the slot. The master releases the slot once those sends have completed
and those workers have released it (every wait of this thread releases what it can meanwhile).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from collections.abc import Callable
from typing import Any

import numpy as np

from fleet.runtime import waiting
from fleet.runtime.data.chunks import (
    HEADER_BYTES,
    HEADER_WORDS,
    ChunkLayout,
    Field,
    Flag,
    chunk_tag,
    share_bounds,
    write_header,
)
from fleet.runtime.data.queues import SampleQueue, Share
from fleet.runtime.data.shm import Claim, claim_of, describe
from fleet.runtime.protocol import INBOX_DEPTH, Regroup, StartMember, StreamLayout, stream_tag
from fleet.runtime.waiting import WaitTimeout, all_done, poll, wait_request, wait_requests

SHARE_TAG = 31
FANOUT_WINDOW = 4  # chunks a root may have in flight to the other masters


class MemberClock:
    """A member's own epochs: each is exactly `samples_per_epoch` samples of the stream.

    An epoch ends at the sample that completes it, which may lie inside a chunk (for a member
    resumed `done` samples into an epoch, and in every epoch after that one): the chunk's
    rows then go partly to the epoch that ends and partly to the next. `done` of
    `samples_per_epoch` or more (a checkpoint of an older fleet, whose epochs ended only
    at chunk boundaries) ends the epoch with the next sample."""

    def __init__(self, samples_per_epoch: int, done: int = 0):
        self.samples_per_epoch, self.done = samples_per_epoch, done

    def split(self, count: int) -> list[tuple[int, int, bool]]:
        """The next `count` samples of the stream as (start, stop, ends_epoch) row ranges,
        one per epoch they belong to, in order."""
        parts, start = [], 0
        while start < count:
            need = max(1, self.samples_per_epoch - self.done)
            stop = min(count, start + need)
            ends = stop - start == need
            self.done = 0 if ends else self.done + stop - start
            parts.append((start, stop, ends))
            start = stop
        return parts


@dataclass
class Version:
    first: int
    layout: StreamLayout
    _owned: dict = field(default_factory=dict)

    def owned(self, rank: int) -> frozenset[int]:
        """Indices j of the preprocessors paired with `rank` (it owns chunks k with k % P in them)."""
        if rank not in self._owned:
            masters, count = self.layout.masters, len(self.layout.preprocessors)
            self._owned[rank] = frozenset(j for j in range(count) if masters and masters[j % len(masters)] == rank)
        return self._owned[rank]

    def owned_chunks(self, rank: int, start: int, stop: int):
        """The chunks in [start, stop) whose root is `rank`."""
        p, owned = len(self.layout.preprocessors), self.owned(rank)
        return (k for k in range(start, stop) if k % p in owned)


class RegroupBox:
    """The coordinator's Regroup commands that reached this rank, by stream, for all of the
    rank's stream threads to read. A rank can be a stream's master twice at once: the draining
    thread of a group that left, and the thread of a group that joined at a later regroup.
    Both read every Regroup sent here (each the ones newer than its newest), so neither can
    take, and drop, the one the other waits for (the regroup that tells the old thread it left)."""

    def __init__(self, ctrl: Any):
        self.ctrl = ctrl
        self.lock = threading.Lock()
        self.received: dict[int, list[Regroup]] = {}

    def after(self, stream: int, version: int) -> Regroup | None:
        """The oldest Regroup of `stream` newer than `version` that has reached this rank, or None."""
        with self.lock:
            while (message := self.ctrl.improbe(source=0, tag=stream_tag(stream))) is not None:
                command = message.recv()
                if isinstance(command, Regroup):
                    self.received.setdefault(stream, []).append(command)
            return next((c for c in self.received.get(stream, ()) if c.layout.version > version), None)


def regroup_box(ctx) -> RegroupBox:
    """The rank's one `RegroupBox` (`RunContext.regroups`), made at its first use."""
    if ctx.regroups is None:
        ctx.regroups = RegroupBox(ctx.ctrl)
    return ctx.regroups


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
            return poll(test, what, self.ctx.timeout_s, backoff)
        finally:
            self.waiting_for = None


class SlotClaims:
    """The shared-memory slots a master read, in order, held until nothing reads them any
    more: its sends of the chunk (to the other masters, to its workers) complete and the
    workers on its node released their rows read in place."""

    def __init__(self, pool: Any):
        self.pool = pool
        self.held: deque[Claim] = deque()

    def add(self, claim: Claim | None) -> None:
        """Hold `claim` (None: the chunk came as a message, nothing to hold)."""
        if claim is not None:
            self.held.append(claim)
            self.release_ready()

    def release_ready(self) -> None:
        while self.held and all_done(self.held[0].requests) and self.pool.released(self.held[0]):
            self.pool.release(self.held.popleft())

    def release_all(self, wait: bool, timeout_s: float) -> None:
        """Release every slot held, first waiting for the workers' releases if `wait` (after an
        error the job is ending: no wait)."""
        while self.held:
            claim = self.held.popleft()
            if wait:
                poll(lambda: self.pool.released(claim), "the group's workers to release their last shares", timeout_s)
            self.pool.release(claim)


class GroupSends:
    """A master's sends of its group's shares to the workers, at most a window in flight.

    Args:
        group_comm: the group's share communicator (rank 0 the master).
        window: chunks' worth of sends per worker that may be in flight.
        in_place: per group rank, whether it reads shares in place from this node's slots.
        pool: the node's chunk pool (None without shared memory).
        ranks: the group's world ranks.
        wait: how to wait for a send (the stream thread's polling wait).
    """

    def __init__(self, group_comm: Any, window: int, in_place: list[bool], pool: Any, ranks: tuple[int, ...],
                 wait: Callable[[Callable[[], bool], str], Any]):
        self.group_comm, self.window, self.in_place, self.pool, self.ranks = group_comm, window, in_place, pool, ranks
        self.wait = wait
        self.pending: deque = deque()

    def send(self, worker: int, chunk: int, x: np.ndarray, y: np.ndarray, flags: int,
             claim: Claim | None = None, start: int = 0, in_place: bool = True) -> bool:
        """Two messages: the header with the labels after it, then (if any) the rows straight
        from the chunk's buffer (or slot: the claim then waits for that send); or, for a
        worker on the slot's node, the header alone, a descriptor of its rows in the slot (the
        claim then waits for the worker's release). True when the rows are to be read in place.

        `in_place` False: send the rows as bytes even to a worker on the slot's node. A worker
        releases a slot by writing its ticket, once: it may read in place only one share of a
        chunk (a chunk split between two epochs gives it two)."""
        while len(self.pending) >= 2 * self.window * max(1, self.group_comm.size - 1):
            request, _ = self.pending.popleft()
            self.wait(request.Test, f"worker {worker} of the group to take its share")
        head = np.empty(HEADER_WORDS + len(y), np.int64)
        write_header(head[:HEADER_WORDS], chunk, 0, len(y), flags)
        in_place = in_place and claim is not None and len(y) > 0 and self.in_place[worker]
        if in_place:
            head[:HEADER_WORDS] = describe(head, claim.owner, claim.slot, claim.ticket)
            head[Field.SHARE_START] = start
            claim.readers.append(self.pool.local[self.ranks[worker]])
        head[HEADER_WORDS:] = y
        for part in (head, x) if len(y) and not in_place else (head,):
            self.pending.append((self.group_comm.Issend(part, dest=worker, tag=SHARE_TAG), part))
        if claim is not None and len(y) and not in_place:
            claim.requests.append(self.pending[-1][0])
        return in_place

    def leave(self, chunk: int) -> None:
        """Tell every worker that the group leaves (an empty share flagged LEAVE)."""
        for worker in range(1, self.group_comm.size):
            self.send(worker, chunk, np.empty((0,)), np.empty(0, np.int64), Flag.LEAVE)

    def finish(self, timeout_s: float) -> None:
        for request, _ in self.pending:
            wait_request(request, "the group's workers to take their last shares", timeout_s)


class MasterStream(StreamThread):
    """The master's stream thread (see the module docstring)."""

    def __init__(self, ctx, start: StartMember, group_comm: Any, qt: SampleQueue, clock: MemberClock):
        super().__init__(f"stream-{start.layout.stream}", qt)
        self.ctx, self.start_cmd, self.group_comm, self.clock = ctx, start, group_comm, clock
        self.rank = ctx.rank
        self.chunks = ChunkLayout(start.source.chunk_samples, ctx.input_shape)
        self.stream = start.layout.stream
        self.k = start.first_chunk
        self.versions: list[Version] = []
        self.qp: dict[int, tuple[Any, np.ndarray]] = {}  # chunk -> (receive, or None once received; buffer)
        self.inbox: dict[int, tuple[Any, np.ndarray]] = {}
        self.fanout: deque = deque()
        self.qp_chunks = max(1, ctx.spec.runtime.qp_samples // start.source.chunk_samples)
        self.forwarding = True
        self.chunks_done = 0
        self.pool = ctx.pool
        self.claims = SlotClaims(self.pool)
        in_place = [self.pool is not None and self.pool.is_local(r) for r in start.ranks]  # by group rank
        window = max(2, ctx.spec.runtime.qt_samples // start.source.chunk_samples)
        self.shares = GroupSends(group_comm, window, in_place, self.pool, start.ranks, self._wait)
        self.regroups = regroup_box(ctx)

    # -- the loop ----------------------------------------------------------------------

    def stream_loop(self) -> None:
        self._add_version(self.k, self.start_cmd.layout)
        while True:
            version = self._version_at(self.k)
            if self.rank not in version.layout.masters:
                return
            if self._at_end():
                # every member's last chunk is taken: the regroup that removes this master,
                # or the join that moves the end, comes from the coordinator
                if not self._stays():
                    return
                self._take_regroups(block_for=self.versions[-1].layout.version + 1, backoff=waiting.IDLE)
                continue
            self.claims.release_ready()
            self._post_qp()
            self._post_inbox()
            data, claim = self._take_chunk(version)
            notice = int(self.chunks.header(data)[Field.REGROUP_VERSION])
            if notice > self.versions[-1].layout.version and self._stays():
                self._take_regroups(block_for=notice)
            self._forward(data, claim)
            self.k += 1
            self.chunks_done += 1

    def _stays(self) -> bool:
        """True while the newest layout this thread knows still has it as a master: only then
        do later regroups concern it (a leaving master is not sent them)."""
        return self.rank in self.versions[-1].layout.masters

    @property
    def end(self) -> float:
        """The stream's end as far as this thread knows (the newest layout's: ends only move forward)."""
        end = self.versions[-1].layout.end
        return float("inf") if end is None else end

    def _at_end(self) -> bool:
        return self.k >= self.end

    def _version_at(self, chunk: int) -> Version:
        for version in reversed(self.versions):
            if version.first <= chunk:
                return version
        raise LookupError(chunk)

    def _add_version(self, first: int, layout: StreamLayout) -> None:
        self.versions.append(Version(first, layout))

    # -- Qp: receives from the paired preprocessors -----------------------------------

    def _post_qp(self) -> None:
        """Keep receives posted for the chunks this master owns among the stream's next
        `qp_chunks`: the masters of a stream share one Qp, so a stream is never received more
        than a Qp ahead of its position, however many masters it has."""
        version = self._version_at(self.k)
        if not version.owned(self.rank):
            return  # paired with no preprocessor in this layout
        limit = min(self.k + self.qp_chunks, self.end)
        for chunk in version.owned_chunks(self.rank, self.k, limit):
            if len(self.qp) >= self.qp_chunks:
                return
            if chunk in self.qp or self._version_at(chunk) is not version:
                continue
            source = version.layout.preprocessors[chunk % len(version.layout.preprocessors)]
            buffer = self.chunks.new_buffer()
            request = self.ctx.data_parent.Irecv(buffer, source=source, tag=chunk_tag(self.stream, chunk))
            self.qp[chunk] = (request, buffer)

    def _cancel(self, receives: dict, keep=lambda chunk: False) -> None:
        """Cancel the pending receives in `receives` (Qp or the inbox) of the chunks `keep` is
        false for. A receive that completed before its cancel holds its chunk's bytes: it stays,
        received (request None). In Qp, the preprocessor knew newer layouts than this thread,
        and a later layout can give a chunk back to a master an earlier one took it from; the
        chunk waits for the layout that makes this master its owner."""
        for chunk in [c for c in receives if not keep(c) and receives[c][0] is not None]:
            request, buffer = receives.pop(chunk)
            request.Cancel()
            status = wait_request(request, f"cancelling the receive of chunk {chunk}", self.ctx.timeout_s)
            if not status.Is_cancelled():
                receives[chunk] = (None, buffer)

    # -- the masters' distribution ------------------------------------------------------

    def _post_inbox(self) -> None:
        """Keep receives posted for the next `INBOX_DEPTH` chunks other masters are root of,
        from the roots of the newest layout known; a regroup re-posts those past its switch."""
        for chunk in range(self.k, min(self.k + INBOX_DEPTH, self.end)):
            layout = self._version_at(chunk).layout
            if chunk in self.inbox or self.rank not in layout.masters or layout.owner(chunk) == self.rank:
                continue
            root = layout.owner(chunk)
            buffer = self.chunks.new_buffer()
            request = self.ctx.data_parent.Irecv(buffer, source=root, tag=chunk_tag(self.stream, chunk))
            self.inbox[chunk] = (request, buffer)

    def _take_chunk(self, version: Version) -> tuple[np.ndarray, Claim | None]:
        """Chunk `k`: from its preprocessor and on to the other masters (root), or from its
        root; its bytes, and the claim on its slot when it is read in shared memory."""
        layout, chunk = version.layout, self.k
        root = layout.owner(chunk)
        if root != self.rank:
            request, buffer = self.inbox.pop(chunk)
            if request is not None:
                self._wait(request.Test, f"chunk {chunk} of stream {self.stream} from master rank {root}")
            return self._open(buffer)
        request, buffer = self.qp.pop(chunk)
        source = layout.preprocessors[chunk % len(layout.preprocessors)]
        if request is not None:
            self._wait(request.Test, f"chunk {chunk} of stream {self.stream} from preprocessor rank {source}")
        data, claim = self._open(buffer)
        self._pass_on(layout, chunk, buffer, data, claim)
        return data, claim

    def _open(self, buffer: np.ndarray) -> tuple[np.ndarray, Claim | None]:
        claim = claim_of(self.chunks.header(buffer))
        if claim is None:
            return buffer, None
        self.pool.sync()  # the preprocessor's writes of the slot come before its descriptor
        return self.pool.view(claim), claim

    def _pass_on(self, layout: StreamLayout, chunk: int, message: np.ndarray, data: np.ndarray,
                 claim: Claim | None) -> None:
        """Chunk `chunk` to the other masters: the descriptor to those that read the slot in
        place (on this node), the bytes to the rest."""
        while len(self.fanout) >= FANOUT_WINDOW:
            old_chunk, requests = self.fanout.popleft()
            what = f"the other masters of stream {self.stream} to take chunk {old_chunk}"
            self._wait(lambda: all_done(requests), what)
        tag = chunk_tag(self.stream, chunk)
        hollow = is_hollow(self.chunks.header(message))
        requests = []
        for master in (m for m in layout.masters if m != self.rank):
            in_place = claim is not None and self.pool.is_local(master)
            header_only = in_place or hollow
            requests.append(self.ctx.data_parent.Issend(message[:HEADER_BYTES] if header_only else data, dest=master, tag=tag))
            if claim is not None and not in_place:
                claim.requests.append(requests[-1])
        self.fanout.append((chunk, requests))

    def _wait(self, test, what: str, backoff=None):
        """Poll `test` (see `waiting.poll`), releasing the slots this thread is done with meanwhile."""
        def step():
            self.claims.release_ready()
            return test()

        return self._poll(step, f"{what} (at chunk {self.k}, layout version {self.versions[-1].layout.version})", backoff)

    def _drop(self, buffer: np.ndarray) -> None:
        """A received chunk this thread will not take: release its slot, if it has one."""
        claim = claim_of(self.chunks.header(buffer))
        if claim is not None:
            self.pool.release(claim)

    # -- regroups -----------------------------------------------------------------------

    def _take_regroups(self, block_for: int, backoff=None) -> None:
        """Apply the coordinator's Regroup commands up to version `block_for`.

        A chunk's header names the newest regroup its preprocessor knew of, and a switch is
        always past such a chunk, so a master that is still in the stream learns of every
        regroup before it has to act on it; a master that has learnt it is leaving needs
        no more of them (and is sent none), so it stops at the regroup that removes it."""
        while self.versions[-1].layout.version < block_for and self._stays():
            what = f"regroup {block_for} of stream {self.stream} from the coordinator"
            newest = self.versions[-1].layout.version
            self._apply(self._wait(lambda: self.regroups.after(self.stream, newest), what, backoff or waiting.HOT))

    def _apply(self, command: Regroup) -> None:
        self._add_version(command.switch_chunk, command.layout)
        new = command.layout
        switch = command.switch_chunk
        self._cancel(self.qp, keep=lambda c: c < switch or (bool(new.masters) and new.owner(c) == self.rank))
        # the inbox's receives past the switch were posted for the roots of the layout before
        # it (a master that joins at one switch posts them at once, and the next switch can be
        # one chunk later): they are posted again from the new roots
        self._cancel(self.inbox, keep=lambda c: c < switch)

    # -- shares ---------------------------------------------------------------------------

    def _forward(self, data: np.ndarray, claim: Claim | None) -> None:
        """The group's shares of a chunk; a claim on its slot is queued for release only once
        nothing here reads the slot any more (its own rows copied, the workers' sends posted)."""
        header = self.chunks.header(data)
        if not self.forwarding or self.leave_requested.is_set() or is_hollow(header):
            # a hollow chunk means the coordinator has ended this group's part (a checkpoint
            # command the trainer may not have polled yet): the member stops before it
            if self.forwarding:
                self._stop_forwarding()
            self.claims.add(claim)
            return
        index, x, y = int(header[Field.INDEX]), self.chunks.images(data), self.chunks.labels(data)
        own, placed = [], set()  # the workers given a share to read in place (one a chunk at most)
        for start, stop, epoch_end in self.clock.split(int(header[Field.COUNT])):
            bounds = [(start + lo, start + hi) for lo, hi in share_bounds(stop - start, self.group_comm.size)]
            flags = Flag.EPOCH_END if epoch_end else Flag.NONE
            for worker, (lo, hi) in enumerate(bounds[1:], start=1):
                if self.shares.send(worker, index, x[lo:hi], y[lo:hi], flags, claim, lo, worker not in placed):
                    placed.add(worker)
            own.append(Share(*own_rows(x, y, *bounds[0], copy=claim is not None), index, epoch_end=epoch_end))
        self.claims.add(claim)
        for share in own:
            self.qt.put(share, self.ctx.timeout_s)

    def _stop_forwarding(self) -> None:
        """The group leaves: tell the workers, then only take part in the broadcast."""
        self.forwarding = False
        self.shares.leave(self.k)
        self.qt.close()

    def cleanup(self) -> None:
        try:
            if self.forwarding and self.error is None:
                self._stop_forwarding()
            for receives in (self.qp, self.inbox):
                self._cancel(receives)
                for _, buffer in receives.values():  # received, never taken (a job ending on an error)
                    self._drop(buffer)
            for chunk, requests in self.fanout:
                wait_requests(requests, f"the other masters to take chunk {chunk}", self.ctx.timeout_s)
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


def is_hollow(header: np.ndarray) -> bool:
    """A chunk sent without samples, once every member of its stream had left (see preprocessor.py)."""
    return bool(int(header[Field.FLAGS]) & Flag.HOLLOW)


def own_rows(x: np.ndarray, y: np.ndarray, lo: int, hi: int, copy: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """The master's own rows of a chunk's buffer (`x`, `y`: all its rows): views (the buffer is
    this chunk's own), or a copy when they fill less than half of it, so that Qt, bounded in
    samples, does not keep a whole buffer alive per share (a group of 8 would hold 8x the
    bytes of its samples), or when `copy` (a shared-memory slot, which goes back to its owner)."""
    if copy or 2 * (hi - lo) < len(y):
        return x[lo:hi].copy(), y[lo:hi].copy()
    return x[lo:hi], y[lo:hi]


def wait_thread(thread: threading.Thread, what: str, timeout_s: float) -> None:
    """Join a thread, giving up at the deadline."""
    deadline = time.monotonic() + timeout_s
    while thread.is_alive():
        thread.join(timeout=min(1.0, max(0.0, deadline - time.monotonic())))
        if time.monotonic() > deadline and thread.is_alive():

            raise WaitTimeout(f"timed out after {timeout_s:g} s waiting for {what}")
