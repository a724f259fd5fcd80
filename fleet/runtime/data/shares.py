"""A group's shares of each chunk: how its master splits a chunk at the member's epoch ends
and among the group's trainers, keeps its own share and sends the workers theirs.

The master sends a worker its share by synchronous sends (so a slow worker slows the stream
instead of filling memory), two messages a share: the header with the labels, then the rows.
A worker on the node of a chunk's shared-memory slot gets only its share's header (a
descriptor too, with the share's first row) and copies its rows out of the slot itself, then
writes the ticket into its own cell of the slot's row; one on another node gets the rows.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

from fleet.runtime.data.chunks import HEADER_WORDS, ChunkLayout, Field, Flag, is_hollow, share_bounds, write_header
from fleet.runtime.data.queues import SampleQueue, Share
from fleet.runtime.data.shm import Claim, describe
from fleet.runtime.waiting import wait_request

SHARE_TAG = 31


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


class ShareForwarding:
    """A master's hand-out of each chunk it takes to its group: the chunk's rows split at the
    member's epoch ends (`MemberClock`) and into one share per trainer; its own shares into its
    Qt, the workers' by `GroupSends`. When the group leaves (its training thread asks, or a
    hollow chunk says the coordinator has ended its part), it tells the workers and hands out
    nothing more. Owned by the master's stream thread (`MasterStream`), which goes on taking
    chunks for the broadcast after that.

    Args:
        chunks: the stream's chunk layout.
        clock: the member's epochs.
        qt: the master's own Qt.
        sends: the sends of the workers' shares.
        claims: where a chunk's slot is held until nothing reads it (`SlotClaims`).
        leave_requested: set when the group's training thread asks the group to leave.
        timeout_s: how long a put into Qt may wait.
    """

    def __init__(self, chunks: ChunkLayout, clock: MemberClock, qt: SampleQueue, sends: GroupSends, claims: Any,
                 leave_requested: threading.Event, timeout_s: float):
        self.chunks, self.clock, self.qt, self.sends, self.claims = chunks, clock, qt, sends, claims
        self.leave_requested, self.timeout_s = leave_requested, timeout_s
        self.active = True

    def forward(self, k: int, data: np.ndarray, claim: Claim | None) -> None:
        """The group's shares of chunk `k`; a claim on its slot is queued for release only once
        nothing here reads the slot any more (its own rows copied, the workers' sends posted)."""
        header = self.chunks.header(data)
        if not self.active or self.leave_requested.is_set() or is_hollow(header):
            # a hollow chunk means the coordinator has ended this group's part (a checkpoint
            # command the trainer may not have polled yet): the member stops before it
            if self.active:
                self.stop(k)
            self.claims.add(claim)
            return
        index, x, y = int(header[Field.INDEX]), self.chunks.images(data), self.chunks.labels(data)
        own, placed = [], set()  # the workers given a share to read in place (one a chunk at most)
        for start, stop, epoch_end in self.clock.split(int(header[Field.COUNT])):
            bounds = [(start + lo, start + hi) for lo, hi in share_bounds(stop - start, self.sends.group_comm.size)]
            flags = Flag.EPOCH_END if epoch_end else Flag.NONE
            for worker, (lo, hi) in enumerate(bounds[1:], start=1):
                if self.sends.send(worker, index, x[lo:hi], y[lo:hi], flags, claim, lo, worker not in placed):
                    placed.add(worker)
            own.append(Share(*own_rows(x, y, *bounds[0], copy=claim is not None), index, epoch_end=epoch_end))
        self.claims.add(claim)
        for share in own:
            self.qt.put(share, self.timeout_s)

    def stop(self, k: int) -> None:
        """The group leaves at chunk `k`: tell the workers, close the master's Qt."""
        self.active = False
        self.sends.leave(k)
        self.qt.close()

    def finish(self, timeout_s: float) -> None:
        """Wait until the workers took every share sent."""
        self.sends.finish(timeout_s)


def own_rows(x: np.ndarray, y: np.ndarray, lo: int, hi: int, copy: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """The master's own rows of a chunk's buffer (`x`, `y`: all its rows): views (the buffer is
    this chunk's own), or a copy when they fill less than half of it, so that Qt, bounded in
    samples, does not keep a whole buffer alive per share (a group of 8 would hold 8x the
    bytes of its samples), or when `copy` (a shared-memory slot, which goes back to its owner)."""
    if copy or 2 * (hi - lo) < len(y):
        return x[lo:hi].copy(), y[lo:hi].copy()
    return x[lo:hi], y[lo:hi]
