"""The shared-memory chunk pool's bookkeeping: descriptors, slots and their release."""

import numpy as np
import pytest

from fleet.runtime.data.chunks import HEADER_WORDS, ChunkLayout, Field, Flag, write_header
from fleet.runtime.data.shm import ChunkPool, Slots, claim_of, describe, segment_bytes
from fleet.runtime.waiting import WaitTimeout


def test_a_descriptor_names_the_slot_and_ticket_and_keeps_the_chunk_header():
    header = np.zeros(HEADER_WORDS, np.int64)
    write_header(header, index=41, epoch=3, count=64, regroup=(2, 50))
    descriptor = describe(header, owner=5, slot=7, ticket=123)
    claim = claim_of(descriptor)
    assert (claim.owner, claim.slot, claim.ticket) == (5, 7, 123)
    assert descriptor[Field.INDEX] == 41 and descriptor[Field.COUNT] == 64 and descriptor[Field.REGROUP_VERSION] == 2
    assert int(descriptor[Field.FLAGS]) & Flag.IN_SHM and not int(header[Field.FLAGS]) & Flag.IN_SHM
    assert claim_of(header) is None  # a chunk sent as bytes


def test_a_slot_is_free_again_only_when_every_reader_wrote_its_ticket():
    done = np.zeros((2, 4), np.int64)  # 2 slots x 4 ranks on the node
    slots = Slots(done, [np.zeros(8, np.uint8) for _ in range(2)])
    a, b = slots.take(), slots.take()
    assert slots.take() is None  # both taken: the caller sends bytes instead
    ticket_a = slots.hold(a, (1, 2), "chunk 0 of stream 0")
    slots.give_back(b)  # b's chunk went as bytes
    assert slots.take() == b
    done[a, 1] = ticket_a
    assert not slots.reclaim()  # reader 2 still reads it
    done[a, 2] = ticket_a - 1  # an older use of the slot does not count
    assert not slots.reclaim()
    done[a, 2] = ticket_a
    assert slots.reclaim() and slots.take() == a and slots.ticket == 1


def test_a_slot_never_released_times_out_naming_the_late_master():
    done = np.zeros((1, 3), np.int64)
    slots = Slots(done, [np.zeros(8, np.uint8)])
    ticket = slots.hold(slots.take(), (0, 2), "chunk 9 of stream 1")
    done[0, 0] = ticket
    slots.held[0].since -= 100
    with pytest.raises(WaitTimeout, match=r"master rank\(s\) 12 to release chunk 9 of stream 1"):
        slots.check_stuck(60, rank_of=[10, 11, 12].__getitem__)


class FakeWindow:
    """One node's shared window, as `Win.Shared_query` shows it to every process."""

    def __init__(self, sizes: dict[int, int]):
        self.memory = {local: bytearray(size) for local, size in sizes.items()}

    def Shared_query(self, local):
        return self.memory[local], 1

    def Sync(self):
        pass


def test_masters_and_workers_release_a_slot_through_their_own_cells():
    """Node ranks 10 (preprocessor), 11 (master), 12 (its worker): the master's claim waits for
    the worker's release, the preprocessor's slot for the master's."""
    layout = ChunkLayout(4, (1, 2, 2))
    size = segment_bytes(2, 3, layout.nbytes)
    window = FakeWindow({0: size, 1: 0, 2: 0})
    pools = {rank: ChunkPool(window, [10, 11, 12], [10], 2, layout.nbytes, rank) for rank in (10, 11, 12)}
    slots = pools[10].slots_of(10)
    slot = slots.take()
    layout.images(slots.buffers[slot])[:] = 7.0
    ticket = slots.hold(slot, (pools[10].local[11],), "chunk 0 of stream 0")
    claim = claim_of(describe(layout.header(slots.buffers[slot]), 10, slot, ticket))
    assert (layout.images(pools[12].view(claim)) == 7.0).all()  # the worker sees the preprocessor's rows
    claim.readers.append(pools[11].local[12])
    assert not pools[11].released(claim)
    pools[12].release(claim)
    assert pools[11].released(claim) and not slots.reclaim()
    pools[11].release(claim)
    assert slots.reclaim() and slot in slots.free
