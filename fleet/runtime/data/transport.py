"""A stream master's chunk traffic: the receives it keeps posted for the chunks it takes, its
sends of the chunks it is root of to the stream's other masters, and its claims on the
shared-memory slots it reads in place.

The masters' broadcast is point-to-point on purpose: a non-blocking collective advances only
while its ranks call into MPI, round by round (Open MPI's `Ibcast` of a 2 MB chunk, waited on
by sleep-polling, moved 45 MB/s on a 16-core node), where a synchronous send needs one
handshake. A root has at most `FANOUT_WINDOW` chunks in flight, so no master falls further
behind than that. No communicator is ever created for the data, so membership changes
cannot block on one.

A chunk may come as a descriptor of a preprocessor's shared-memory slot (`fleet.runtime.data.shm`):
the master then reads it in place and passes the descriptor on to the masters of its node and
the bytes to the others. The master releases the slot once those sends have completed and
the workers that read it in place have released it (`SlotClaims`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

from fleet.runtime.data.chunks import HEADER_BYTES, ChunkLayout, chunk_tag, is_hollow
from fleet.runtime.data.layouts import LayoutHistory
from fleet.runtime.data.shm import Claim, claim_of
from fleet.runtime.protocol import INBOX_DEPTH, StreamLayout
from fleet.runtime.waiting import all_done, poll, wait_request, wait_requests

FANOUT_WINDOW = 4  # chunks a root may have in flight to the other masters

Wait = Callable[..., Any]  # (test, what[, backoff]): the stream thread's polling wait


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


class ChunkReceives:
    """The receives a master keeps posted for its stream's chunks, and the chunks they bring:
    Qp, those its paired preprocessors send it (the chunks it is root of), and the inbox,
    those their roots pass on to it. A regroup cancels the receives its layout gives to
    another master or root. Owned by the master's stream thread (`MasterStream`), which
    posts them ahead of its position and waits for the one it takes next.

    Args:
        data_comm: the data communicator (`RunContext.data_parent`).
        stream: the stream's id.
        rank: this master's world rank.
        chunks: the stream's chunk layout (its buffers' size).
        qp_chunks: the stream's Qp in chunks, shared by its masters.
        pool: this node's chunk pool (None without shared memory).
        timeout_s: how long a cancel may take.
    """

    def __init__(self, data_comm: Any, stream: int, rank: int, chunks: ChunkLayout, qp_chunks: int, pool: Any,
                 timeout_s: float):
        self.data_comm, self.stream, self.rank, self.chunks = data_comm, stream, rank, chunks
        self.qp_chunks, self.pool, self.timeout_s = qp_chunks, pool, timeout_s
        self.qp: dict[int, tuple[Any, np.ndarray]] = {}  # chunk -> (receive, or None once received; buffer)
        self.inbox: dict[int, tuple[Any, np.ndarray]] = {}

    def post_qp(self, k: int, layouts: LayoutHistory) -> None:
        """Keep receives posted for the chunks this master owns among the stream's next
        `qp_chunks` from chunk `k`: the masters of a stream share one Qp, so a stream is never
        received more than a Qp ahead of its position, however many masters it has."""
        version = layouts.at(k)
        if not version.owned(self.rank):
            return  # paired with no preprocessor in this layout
        limit = min(k + self.qp_chunks, layouts.end)
        for chunk in version.owned_chunks(self.rank, k, limit):
            if len(self.qp) >= self.qp_chunks:
                return
            if chunk in self.qp or layouts.at(chunk) is not version:
                continue
            source = version.layout.preprocessors[chunk % len(version.layout.preprocessors)]
            buffer = self.chunks.new_buffer()
            request = self.data_comm.Irecv(buffer, source=source, tag=chunk_tag(self.stream, chunk))
            self.qp[chunk] = (request, buffer)

    def post_inbox(self, k: int, layouts: LayoutHistory) -> None:
        """Keep receives posted for the next `INBOX_DEPTH` chunks from chunk `k` that other
        masters are root of, from the roots of the newest layout known; a regroup re-posts
        those past its switch."""
        for chunk in range(k, min(k + INBOX_DEPTH, layouts.end)):
            layout = layouts.at(chunk).layout
            if chunk in self.inbox or self.rank not in layout.masters or layout.owner(chunk) == self.rank:
                continue
            root = layout.owner(chunk)
            buffer = self.chunks.new_buffer()
            request = self.data_comm.Irecv(buffer, source=root, tag=chunk_tag(self.stream, chunk))
            self.inbox[chunk] = (request, buffer)

    def take(self, chunk: int, layout: StreamLayout, wait: Wait) -> np.ndarray:
        """Chunk `chunk`'s buffer once it has come (`wait` polls for it): from its preprocessor
        where `layout` makes this master its root, else from its root."""
        root = layout.owner(chunk)
        if root != self.rank:
            request, buffer = self.inbox.pop(chunk)
            what = f"chunk {chunk} of stream {self.stream} from master rank {root}"
        else:
            request, buffer = self.qp.pop(chunk)
            source = layout.preprocessors[chunk % len(layout.preprocessors)]
            what = f"chunk {chunk} of stream {self.stream} from preprocessor rank {source}"
        if request is not None:
            wait(request.Test, what)
        return buffer

    def open(self, buffer: np.ndarray) -> tuple[np.ndarray, Claim | None]:
        """A received chunk's bytes: the buffer itself, or the shared-memory slot its
        descriptor names, with the claim on that slot."""
        claim = claim_of(self.chunks.header(buffer))
        if claim is None:
            return buffer, None
        self.pool.sync()  # the preprocessor's writes of the slot come before its descriptor
        return self.pool.view(claim), claim

    def regroup(self, switch: int, new: StreamLayout) -> None:
        """Layout `new` holds from chunk `switch` on: cancel the receives it gives to others."""
        self._cancel(self.qp, keep=lambda c: c < switch or (bool(new.masters) and new.owner(c) == self.rank))
        # the inbox's receives past the switch were posted for the roots of the layout before
        # it (a master that joins at one switch posts them at once, and the next switch can be
        # one chunk later): they are posted again from the new roots
        self._cancel(self.inbox, keep=lambda c: c < switch)

    def close(self) -> None:
        """Cancel every receive still pending and release the slots of chunks received and
        never taken (a job ending on an error)."""
        for receives in (self.qp, self.inbox):
            self._cancel(receives)
            for _, buffer in receives.values():
                self._drop(buffer)

    def _cancel(self, receives: dict, keep=lambda chunk: False) -> None:
        """Cancel the pending receives in `receives` (Qp or the inbox) of the chunks `keep` is
        false for. A receive that completed before its cancel holds its chunk's bytes: it stays,
        received (request None). In Qp, the preprocessor knew newer layouts than this thread,
        and a later layout can give a chunk back to a master an earlier one took it from; the
        chunk waits for the layout that makes this master its owner."""
        for chunk in [c for c in receives if not keep(c) and receives[c][0] is not None]:
            request, buffer = receives.pop(chunk)
            request.Cancel()
            status = wait_request(request, f"cancelling the receive of chunk {chunk}", self.timeout_s)
            if not status.Is_cancelled():
                receives[chunk] = (None, buffer)

    def _drop(self, buffer: np.ndarray) -> None:
        """A received chunk this master will not take: release its slot, if it has one."""
        claim = claim_of(self.chunks.header(buffer))
        if claim is not None:
            self.pool.release(claim)


class ChunkFanout:
    """A root master's sends of its chunks to the stream's other masters: the descriptor to
    those that read its slot in place (on this node), the bytes to the rest, a header alone
    for a hollow chunk; at most `FANOUT_WINDOW` chunks in flight. A claim on a slot waits for
    the sends of its bytes. Owned by the master's stream thread (`MasterStream`).

    Args:
        data_comm: the data communicator (`RunContext.data_parent`).
        stream: the stream's id.
        rank: this master's world rank.
        chunks: the stream's chunk layout.
        pool: this node's chunk pool (None without shared memory).
        wait: how to wait for the oldest chunk's sends (the stream thread's polling wait).
    """

    def __init__(self, data_comm: Any, stream: int, rank: int, chunks: ChunkLayout, pool: Any, wait: Wait):
        self.data_comm, self.stream, self.rank, self.chunks, self.pool = data_comm, stream, rank, chunks, pool
        self.wait = wait
        self.in_flight: deque = deque()  # (chunk, its sends)

    def pass_on(self, layout: StreamLayout, chunk: int, message: np.ndarray, data: np.ndarray,
                claim: Claim | None) -> None:
        """Chunk `chunk` (`message` as received, `data` its bytes) to the other masters of `layout`."""
        while len(self.in_flight) >= FANOUT_WINDOW:
            old_chunk, requests = self.in_flight.popleft()
            what = f"the other masters of stream {self.stream} to take chunk {old_chunk}"
            self.wait(lambda: all_done(requests), what)
        tag = chunk_tag(self.stream, chunk)
        hollow = is_hollow(self.chunks.header(message))
        requests = []
        for master in (m for m in layout.masters if m != self.rank):
            in_place = claim is not None and self.pool.is_local(master)
            header_only = in_place or hollow
            requests.append(self.data_comm.Issend(message[:HEADER_BYTES] if header_only else data, dest=master, tag=tag))
            if claim is not None and not in_place:
                claim.requests.append(requests[-1])
        self.in_flight.append((chunk, requests))

    def finish(self, timeout_s: float) -> None:
        """Wait until the other masters took every chunk sent."""
        for chunk, requests in self.in_flight:
            wait_requests(requests, f"the other masters to take chunk {chunk}", timeout_s)
