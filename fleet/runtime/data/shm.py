"""Node-local shared memory for decoded chunks: the masters of a node read them in place.

Each preprocessor owns `slots` chunk-sized slots in one MPI shared-memory window per node
(`MPI_Win_allocate_shared` on the ranks of a node, virtual nodes honoured). It decodes a
chunk into a free slot and, when the chunk's root master is on its node, sends that master
only the chunk's header marked `Flag.IN_SHM` with the slot's place and a ticket (a
descriptor, 64 bytes) instead of the chunk. The root passes the descriptor on to the other
masters of its node and the chunk's bytes to masters on other nodes; each master copies its
own share out of the slot and sends its workers theirs from it.

A slot is free again when every master of the chunk's node that reads it (its *readers*)
has written the ticket into its own cell of the slot's row of the owner's done table: each
cell has one writer, so no atomics are needed, and a `Win_sync` on both sides orders the
reads of the slot before the write of the cell (and the cell before the slot's reuse).
Where no slot is free the preprocessor sends the chunk's bytes as before, so a slow stream
never holds up another through the pool.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fleet.runtime.data.chunks import HEADER_WORDS, Field, Flag
from fleet.runtime.waiting import WaitTimeout, bcast_object

SLOT_LIMIT = 1 << 16  # a descriptor's place word: owner rank * SLOT_LIMIT + slot
ALIGN = 4096
SHM_HEADROOM = 1.25  # /dev/shm must have this much more free than the pool needs


def describe(header: np.ndarray, owner: int, slot: int, ticket: int) -> np.ndarray:
    """The descriptor of a chunk in slot `slot` of preprocessor `owner` (its header, marked)."""
    descriptor = np.array(header[:HEADER_WORDS], np.int64)
    descriptor[Field.FLAGS] |= Flag.IN_SHM
    descriptor[Field.SHM_PLACE] = owner * SLOT_LIMIT + slot
    descriptor[Field.SHM_TICKET] = ticket
    return descriptor


@dataclass(frozen=True)
class Claim:
    """A master's hold on a chunk in shared memory: released once `requests` (its sends of
    rows read from the slot) have completed and `readers` (node-local indices of its workers
    that read their rows in place) have released it."""

    owner: int
    slot: int
    ticket: int
    requests: list = field(default_factory=list)
    readers: list = field(default_factory=list)


def claim_of(header: np.ndarray) -> Claim | None:
    """The claim a received header stands for, or None for a chunk that came as bytes."""
    if not int(header[Field.FLAGS]) & Flag.IN_SHM:
        return None
    owner, slot = divmod(int(header[Field.SHM_PLACE]), SLOT_LIMIT)
    return Claim(owner, slot, int(header[Field.SHM_TICKET]))


def unreleased(done: np.ndarray, slot: int, ticket: int, readers) -> list[int]:
    """The readers (node-local indices) whose cell of `slot`'s row does not show `ticket` yet."""
    return [r for r in readers if done[slot, r] != ticket]


@dataclass
class Held:
    slot: int
    ticket: int
    readers: tuple[int, ...]  # node-local indices whose done cells must show the ticket
    what: str
    since: float


class Slots:
    """A preprocessor's slots: which are free, and which wait for their readers (pure
    bookkeeping over `done`, the slots x node-ranks table the readers write)."""

    def __init__(self, done: np.ndarray, buffers: list[np.ndarray], sync=lambda: None):
        self.done, self.buffers, self.sync = done, buffers, sync
        self.free = list(range(len(buffers)))[::-1]
        self.held: list[Held] = []
        self.ticket = 0  # also the count of chunks that went through a slot

    def take(self) -> int | None:
        return self.free.pop() if self.free else None

    def hold(self, slot: int, readers: tuple[int, ...], what: str) -> int:
        """Mark `slot` as read by `readers` until they release it; returns its ticket."""
        self.ticket += 1
        self.held.append(Held(slot, self.ticket, readers, what, time.monotonic()))
        return self.ticket

    def give_back(self, slot: int) -> None:
        """A slot taken but not held (its chunk went as bytes)."""
        self.free.append(slot)

    def reclaim(self) -> bool:
        """Free every held slot whose readers all released it; True if any was."""
        ready = [h for h in self.held if not unreleased(self.done, h.slot, h.ticket, h.readers)]
        if not ready:
            return False
        self.sync()  # the readers' reads of the slots come before its reuse
        for h in ready:
            self.held.remove(h)
            self.free.append(h.slot)
        return True

    def check_stuck(self, timeout_s: float, rank_of) -> None:
        now = time.monotonic()
        for h in self.held:
            if now - h.since > timeout_s:
                late = [rank_of(r) for r in unreleased(self.done, h.slot, h.ticket, h.readers)]
                raise WaitTimeout(f"timed out after {timeout_s:g} s waiting for master rank(s) "
                                  f"{', '.join(map(str, late))} to release {h.what} from shared memory")


class ChunkPool:
    """This node's shared window: every preprocessor's done table and slots, mapped by every
    rank of the node."""

    def __init__(self, win: Any, node_ranks: list[int], owners: list[int], slots: int, slot_bytes: int, me: int):
        self.win, self.node_ranks, self.slots, self.slot_bytes = win, node_ranks, slots, slot_bytes
        self.stride = slot_stride(slot_bytes)
        self.local = {rank: i for i, rank in enumerate(node_ranks)}
        self.me = self.local[me]
        self.segments = {owner: self._segment(owner) for owner in owners}

    def _segment(self, owner: int) -> tuple[np.ndarray, list[np.ndarray]]:
        memory, _ = self.win.Shared_query(self.local[owner])
        raw = np.frombuffer(memory, np.uint8)
        table = table_bytes(self.slots, len(self.node_ranks))
        done = raw[: self.slots * len(self.node_ranks) * 8].view(np.int64).reshape(self.slots, len(self.node_ranks))
        starts = [table + i * self.stride for i in range(self.slots)]
        buffers = [raw[start : start + self.slot_bytes] for start in starts]
        return done, buffers

    def is_local(self, rank: int) -> bool:
        return rank in self.local

    def slots_of(self, owner: int) -> Slots:
        done, buffers = self.segments[owner]
        return Slots(done, buffers, self.sync)

    def view(self, claim: Claim) -> np.ndarray:
        return self.segments[claim.owner][1][claim.slot]

    def released(self, claim: Claim) -> bool:
        """True once every reader of `claim` has released the slot."""
        return not unreleased(self.segments[claim.owner][0], claim.slot, claim.ticket, claim.readers)

    def release(self, claim: Claim) -> None:
        """This rank is done with the claim's slot (its reads of it come first)."""
        self.sync()
        self.segments[claim.owner][0][claim.slot, self.me] = claim.ticket

    def sync(self) -> None:
        self.win.Sync()

    def free(self) -> None:
        self.win.Unlock_all()
        self.win.Free()


def table_bytes(slots: int, node_size: int) -> int:
    return -(-slots * node_size * 8 // ALIGN) * ALIGN


def slot_stride(slot_bytes: int) -> int:
    return -(-slot_bytes // 64) * 64


def segment_bytes(slots: int, node_size: int, slot_bytes: int) -> int:
    return table_bytes(slots, node_size) + slots * slot_stride(slot_bytes)


def shm_free_bytes(path: str = "/dev/shm") -> int | None:
    try:
        stat = os.statvfs(path)
    except OSError:
        return None
    return stat.f_bavail * stat.f_frsize


def create_pool(world: Any, topology: Any, slots: int, slot_bytes: int, timeout_s: float, say=print) -> ChunkPool | None:
    """Collective over `world`: this node's pool, or None where /dev/shm lacks the room (said
    once per node) or the node has no preprocessor."""
    from mpi4py import MPI

    shared = world.Split_type(MPI.COMM_TYPE_SHARED, key=world.rank)
    node = shared.Split(color=topology.node_of(world.rank), key=world.rank)
    shared.Free()
    try:
        node_ranks = list(MPI.Group.Translate_ranks(node.Get_group(), list(range(node.size)), world.Get_group()))
        preprocessors = set(topology.preprocessor_ranks())
        owners = [r for r in node_ranks if r in preprocessors]
        if not owners:
            return None
        size = segment_bytes(slots, len(node_ranks), slot_bytes)
        room = None
        if node.rank == 0:
            free = shm_free_bytes()
            room = free is None or free >= SHM_HEADROOM * size * len(owners)
            if not room:
                say(f"fleet: node {topology.node_of(world.rank)}: /dev/shm has {free / 2**20:,.0f} MiB free, the "
                    f"chunk pool needs {size * len(owners) / 2**20:,.0f} MiB; chunks go by MPI messages "
                    "(set runtime.shared_memory: false to say so, or give the job more /dev/shm)", flush=True)
        if not bcast_object(node, room, 0, "the shared-memory decision of this node", timeout_s):
            return None
        win = MPI.Win.Allocate_shared(size if world.rank in owners else 0, 1, comm=node)
        win.Lock_all()
        pool = ChunkPool(win, node_ranks, owners, slots, slot_bytes, world.rank)
        if world.rank in owners:
            pool.segments[world.rank][0][:] = 0
        pool.sync()
        return pool
    finally:
        node.Free()
