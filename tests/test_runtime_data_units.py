"""The runtime's data plane without processes: chunks, stream order, member clocks and stream
ends, queues and batches, a stream master's receives, broadcast, shares and regroups."""

from collections import deque
from types import SimpleNamespace

import numpy as np
import pytest

from fleet.runtime.data.chunks import ChunkLayout, Field, StreamOrder, member_end_chunk, share_bounds, write_header
from fleet.runtime.data.queues import Batcher, SampleQueue, Share
from fleet.runtime.data.shares import GroupSends, MemberClock, ShareForwarding, own_rows
from fleet.runtime.data.stream import MasterStream
from fleet.runtime.data.transport import SlotClaims
from fleet.runtime.protocol import Regroup, StreamLayout, StreamSource, stream_tag
from fleet.runtime.waiting import WaitTimeout


def test_share_bounds_are_contiguous_and_balanced():
    for count in range(0, 70):
        for parts in range(1, 6):
            bounds = share_bounds(count, parts)
            sizes = [hi - lo for lo, hi in bounds]
            assert bounds[0][0] == 0 and bounds[-1][1] == count
            assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
            assert max(sizes) - min(sizes) <= 1


def test_chunk_layout_views_are_disjoint_and_round_trip():
    layout = ChunkLayout(capacity=5, sample_shape=(3, 4, 4))
    buffer = layout.new_buffer()
    assert buffer.nbytes == layout.nbytes == 64 + 5 * 8 + 5 * 3 * 16 * 4
    write_header(layout.header(buffer), index=7, epoch=2, count=4, regroup=(3, 40))
    layout.labels(buffer)[:] = np.arange(5)
    layout.images(buffer)[:] = 1.5
    header = layout.header(buffer)
    assert header[Field.INDEX] == 7 and header[Field.COUNT] == 4 and header[Field.REGROUP_SWITCH] == 40
    assert list(layout.labels(buffer)) == [0, 1, 2, 3, 4] and float(layout.images(buffer).sum()) == 1.5 * 5 * 48


def test_stream_order_covers_each_sample_once_per_epoch_and_is_reproducible():
    train_idx = np.arange(10, 110)
    source = StreamSource(seed=3, salt=9, base_epoch=2, chunk_samples=32)
    order = StreamOrder(train_idx, source)
    assert order.chunks_per_epoch == 4
    for epoch in range(2):
        chunks = [order.indices(epoch * 4 + i) for i in range(4)]
        assert [len(c) for c in chunks] == [32, 32, 32, 4]
        assert sorted(np.concatenate(chunks)) == list(train_idx)
    again = StreamOrder(train_idx, source)
    assert list(again.indices(5)) == list(order.indices(5))
    assert list(order.indices(0)) != list(order.indices(4))  # a new shuffle each epoch
    assert order.rng(3).integers(1 << 30) == again.rng(3).integers(1 << 30)
    resumed = StreamOrder(train_idx, StreamSource(3, 9, base_epoch=3, chunk_samples=32))
    assert list(resumed.indices(0)) == list(order.indices(4))  # a resumed stream continues the order


def test_member_clock_ends_each_epoch_at_exactly_its_samples():
    clock = MemberClock(samples_per_epoch=100, done=40)
    assert clock.split(32) == [(0, 32, False)]
    assert clock.split(32) == [(0, 28, True), (28, 32, False)]  # 40 + 32 + 28: the chunk is split
    assert clock.split(64) == [(0, 64, False)]
    assert clock.split(36) == [(0, 32, True), (32, 36, False)] and clock.done == 4
    assert MemberClock(100, done=130).split(8) == [(0, 1, True), (1, 8, False)]  # an older fleet's checkpoint


def test_a_member_resumed_mid_epoch_trains_exactly_the_rest_of_that_epoch():
    """The resumed epoch that trained up to a chunk too much: 256 samples into a 1,438-sample
    epoch, the stream's 64-sample chunks gave it 1,472 (and digits' 512-sample chunks 1,694)."""
    for c in (64, 512):
        n, clock, chunk, epochs = 1438, MemberClock(1438, done=256), 0, []
        counted = 256
        while len(epochs) < 3:
            for start, stop, ends in clock.split(min(c, n - (chunk % -(-n // c)) * c)):
                counted += stop - start
                if ends:
                    epochs.append(counted)
                    counted = 0
            chunk += 1
        assert epochs == [n, n, n], c
        assert member_end_chunk(0, 3, n, c, done=256) == chunk


def clock_end(first, epochs, n, c, done):
    """Where `MemberClock`, fed the stream's chunk counts from `first`, ends its `epochs`-th epoch."""
    per_epoch, clock, chunk = -(-n // c), MemberClock(n, done), first
    while epochs:
        epochs -= sum(ends for _, _, ends in clock.split(min(c, n - (chunk % per_epoch) * c)))
        chunk += 1
    return chunk


@pytest.mark.parametrize("n, c", [(100, 10), (100, 30), (7, 3), (1000, 296), (5, 8)])
def test_member_end_chunk_is_where_the_member_clock_ends_its_last_epoch(n, c):
    # done >= n: the member left partway through the chunk that ended its epoch
    positions = (0, 1, n // 2, n - 1, n, n + c - 1)
    cases = [(first, epochs, done) for first in (0, 1, 3, 11) for epochs in (1, 2, 5) for done in positions]
    for first, epochs, done in cases:
        assert member_end_chunk(first, epochs, n, c, done) == clock_end(first, epochs, n, c, done), (first, epochs, done)
    assert member_end_chunk(0, 2, 1000, 296) == 8  # 4 chunks an epoch, the last of 112


def test_a_member_resumed_past_its_epochs_samples_gets_the_stream_it_needs():
    """The bench's hang (32 emulated models, FLEET-G round 17): three members resumed 2,848 and
    2,784 samples into 2,700-sample epochs; the stream ended at chunk 9, before their second
    epoch did, and every rank waited for the other until the timeout."""
    assert member_end_chunk(0, 2, 2700, 296, done=2848) == 11
    assert member_end_chunk(0, 2, 2700, 296, done=2784) == 11


def shares(sizes, epoch_end_at):
    return [Share(np.full((n, 1, 2, 2), i, np.float32), np.full(n, i), i, epoch_end=(i in epoch_end_at))
            for i, n in enumerate(sizes)]


def test_batcher_never_crosses_an_epoch_end_and_drops_single_sample_batches():
    queue = SampleQueue(capacity=1000, name="Qt")
    for share in shares([20, 20, 5], epoch_end_at={2}) + shares([17, 1], epoch_end_at={1}):
        queue.put(share, timeout_s=1)
    queue.put(Share(np.empty(0), np.empty(0, np.int64), -1, leave=True), timeout_s=1)
    batcher = Batcher(queue, batch_size=16, depth=4, timeout_s=5, name="t")
    got = []
    while True:
        batch = batcher.get()
        if batch.leave:
            break
        got.append((batch.count, batch.epoch_end))
    batcher.stop()
    assert got == [(16, False), (16, False), (13, True), (16, False), (2, True)]


def test_batcher_passes_the_rows_on_in_pieces_without_copying_them():
    queue = SampleQueue(capacity=1000, name="Qt")
    sent = shares([10, 10, 10], epoch_end_at=set())
    for share in sent:
        queue.put(share, timeout_s=1)
    batcher = Batcher(queue, batch_size=16, depth=4, timeout_s=5, name="t")
    batch = batcher.get()
    batcher.stop()
    assert [len(part) for part in batch.x.parts] == [10, 6]
    assert all(np.shares_memory(part, share.x) for part, share in zip(batch.x.parts, sent))
    expected = np.concatenate([sent[0].x, sent[1].x[:6]])
    assert batch.x.shape == expected.shape and np.array_equal(np.asarray(batch.x), expected)
    assert np.array_equal(batch.y, np.concatenate([sent[0].y, sent[1].y[:6]]))


def test_batcher_joins_a_batch_that_spans_many_shares():
    queue = SampleQueue(capacity=1000, name="Qt")
    sent = shares([2] * 8, epoch_end_at=set())
    for share in sent:
        queue.put(share, timeout_s=1)
    batcher = Batcher(queue, batch_size=16, depth=4, timeout_s=5, name="t")
    batch = batcher.get()
    batcher.stop()
    assert isinstance(batch.x, np.ndarray) and not any(np.shares_memory(batch.x, s.x) for s in sent)
    assert np.array_equal(batch.x, np.concatenate([s.x for s in sent]))


def test_a_master_keeps_views_of_half_a_chunk_and_copies_of_less():
    x, y = np.arange(8 * 4, dtype=np.float32).reshape(8, 1, 2, 2), np.arange(8)
    half_x, half_y = own_rows(x, y, 0, 4)  # a group of 2
    assert np.shares_memory(half_x, x) and np.shares_memory(half_y, y)
    quarter_x, quarter_y = own_rows(x, y, 0, 2)  # a group of 4: the chunk's buffer can go
    assert not np.shares_memory(quarter_x, x) and not np.shares_memory(quarter_y, y)
    assert np.array_equal(quarter_x, x[:2]) and np.array_equal(quarter_y, y[:2])


def test_batcher_drops_a_lone_last_sample():
    queue = SampleQueue(capacity=100, name="Qt")
    for share in shares([17], epoch_end_at={0}):
        queue.put(share, timeout_s=1)
    batcher = Batcher(queue, batch_size=16, depth=4, timeout_s=5, name="t")
    assert [(b.count, b.epoch_end) for b in (batcher.get(), batcher.get())] == [(16, False), (0, True)]
    batcher.stop()


def test_sample_queue_blocks_when_full_and_names_itself_on_timeout():
    queue = SampleQueue(capacity=10, name="Qt of m1")
    queue.put(shares([8], set())[0], timeout_s=1)
    with pytest.raises(WaitTimeout, match="room in Qt of m1"):
        queue.put(shares([8], set())[0], timeout_s=0.05)
    queue.get(timeout_s=1)
    with pytest.raises(WaitTimeout, match="samples in Qt of m1"):
        queue.get(timeout_s=0.05)


class FakeReceive:
    """An `Irecv` a test completes by hand (`arrived`); a cancel succeeds only before that."""

    def __init__(self, buffer):
        self.buffer, self.arrived, self.cancelled = buffer, False, False

    def Cancel(self):
        self.cancelled = not self.arrived

    def Test(self, status=None):
        if self.cancelled and status is not None:
            status.Set_cancelled(True)
        return self.arrived or self.cancelled


class FakeDataComm:
    def __init__(self, size: int = 1):
        self.receives, self.sends, self.messages, self.size = {}, [], [], size

    def Irecv(self, buffer, source, tag):
        self.receives[(tag - 100_000) % 4096] = FakeReceive(buffer)  # stream 0: chunk index
        self.receives[(tag - 100_000) % 4096].source = source
        return self.receives[(tag - 100_000) % 4096]

    def Issend(self, buffer, dest, tag):
        self.sends.append((dest, (tag - 100_000) % 4096))
        self.messages.append(np.array(buffer, copy=True))
        return FakeReceive(buffer)


def master_stream(comm, rank: int, layout: StreamLayout, first_chunk: int, qp_chunks: int = 30) -> MasterStream:
    """A `MasterStream` (not started) as a group master builds it, over fake data and group
    communicators, for chunks of 4 samples of shape (1, 2, 2) and a Qp of `qp_chunks`."""
    runtime = SimpleNamespace(qp_samples=4 * qp_chunks, qt_samples=64)
    ctx = SimpleNamespace(rank=rank, input_shape=(1, 2, 2), pool=None, data_parent=comm, timeout_s=5.0, ctrl=None,
                          regroups=None, spec=SimpleNamespace(runtime=runtime))
    start = SimpleNamespace(layout=layout, first_chunk=first_chunk, source=StreamSource(1, 0, 0, 4), ranks=(rank,))
    return MasterStream(ctx, start, FakeDataComm(), SampleQueue(64, "Qt"), MemberClock(20))


def test_a_chunk_that_arrived_before_its_receive_was_cancelled_stays_in_qp():
    # The homogeneous hang (8 trainers, 6 preprocessors): master 8 lags and knows layout v1,
    # where it owns chunk 104; preprocessor 2 already knows v6, where it owns 104 again, and
    # sends it. Learning v2 (104 to master 9) cancelled the receive after the chunk had
    # arrived and dropped it; learning v6, master 8 posted a new receive that nobody served.
    from fleet.runtime.protocol import Regroup

    comm, preprocessors = FakeDataComm(), (0, 1, 2, 3, 4, 5)
    # Qp: chunks 80-109
    master = master_stream(comm, 8, StreamLayout(0, 1, preprocessors, (6, 7, 8, 9, 10, 11, 13)), 80, qp_chunks=30)
    receives = master.receives
    receives.post_qp(master.k, master.layouts)
    assert sorted(receives.qp) == [80, 86, 92, 98, 104]
    comm.receives[104].arrived = True
    write_header(master.chunks.header(comm.receives[104].buffer), 104, 0, 4)  # a chunk's bytes, not a descriptor
    master._apply(Regroup(StreamLayout(0, 2, preprocessors, (6, 8, 9, 10, 11, 13)), 92))
    assert sorted(receives.qp) == [80, 86, 104] and receives.qp[104][0] is None  # received, kept
    assert comm.receives[98].cancelled and not comm.receives[104].cancelled
    master._apply(Regroup(StreamLayout(0, 6, preprocessors, (8, 13)), 99))
    assert 104 in receives.qp
    master.k = 104
    data, claim = master._take_chunk(master.layouts.at(104))
    assert data is comm.receives[104].buffer and claim is None
    assert comm.sends == [(13, 104)]  # passed on to the other master


def test_preprocessors_and_masters_stop_at_the_stream_end():
    from fleet.runtime.data.preprocessor import StreamProducer
    from fleet.runtime.protocol import Regroup

    layout = StreamLayout(0, 0, (0, 1), (8,), end=5)
    producer = StreamProducer.__new__(StreamProducer)
    producer.layouts, producer.paused, producer.in_flight, producer.window = [(0, layout)], False, deque(), 4
    producer.next_chunk = 4
    assert producer.can_produce()
    producer.next_chunk = 6
    assert not producer.can_produce() and not producer.finished  # waits, open, for the regroup
    producer.regroup(Regroup(StreamLayout(0, 1, (0, 1), (8, 9), end=9), 5))
    assert producer.can_produce()

    comm = FakeDataComm()
    master = master_stream(comm, 8, layout, first_chunk=2, qp_chunks=30)
    master.receives.post_qp(master.k, master.layouts)
    master.receives.post_inbox(master.k, master.layouts)
    assert sorted(master.receives.qp) == [2, 3, 4] and master.receives.inbox == {}  # the only master: it owns all of them
    assert master.layouts.at_end(5)


def test_once_every_member_has_left_the_chunks_before_the_switch_go_out_hollow():
    # A round ends: every member of the stream leaves, and the switch (chunk 6) is past what
    # the preprocessor had made (chunk 4 next). The master still takes chunks 4 and 5, as it
    # takes every chunk before a switch, but they come as headers with nothing decoded, and
    # the member, whose checkpoint command may still be unread, trains on nothing past them.
    import threading
    from types import SimpleNamespace

    from fleet.runtime.data.chunks import HEADER_BYTES, Flag
    from fleet.runtime.data.preprocessor import StreamProducer
    from fleet.runtime.protocol import Regroup

    source, chunks = StreamSource(1, 0, 0, 4), ChunkLayout(4, (1, 2, 2))
    data = FakeDataComm()
    producer = StreamProducer.__new__(StreamProducer)
    producer.ctx = SimpleNamespace(data_parent=data, reader=None)  # nothing may be read
    producer.layouts, producer.order = [(0, StreamLayout(0, 0, (2,), (8,)))], StreamOrder(np.arange(20), source)
    producer.paused, producer.in_flight, producer.window, producer.stride = False, deque(), 4, 1
    producer.next_chunk, producer.decoded, producer.hollow = 4, 0, 0
    producer.regroup(Regroup(StreamLayout(0, 1, (2,), ()), 6))
    while producer.can_produce():
        producer.produce()
    assert data.sends == [(8, 4), (8, 5)] and (producer.decoded, producer.hollow) == (0, 2)
    hollow = data.messages[0].view(np.int64)
    assert hollow.size * 8 == HEADER_BYTES and hollow[Field.FLAGS] == Flag.HOLLOW
    assert (hollow[Field.REGROUP_VERSION], hollow[Field.REGROUP_SWITCH]) == (1, 6)  # the notice, as in any chunk
    for request in producer.in_flight:
        request.request.arrived = True
    producer.progress()
    assert producer.finished

    group = FakeDataComm(size=2)  # the master and one worker
    sends = GroupSends(group, 2, [False, False], None, (0, 1), lambda test, what: test())
    shares = ShareForwarding(chunks, MemberClock(20), SampleQueue(64, "Qt"), sends, SlotClaims(None), threading.Event(),
                             timeout_s=5.0)
    real = chunks.new_buffer()
    write_header(chunks.header(real), 3, 0, 4)
    shares.forward(3, real, None)
    received = chunks.new_buffer()
    received[:HEADER_BYTES] = data.messages[0].view(np.uint8)
    shares.forward(4, received, None)
    assert shares.clock.done == 4 and not shares.active  # chunk 3's samples, then nothing
    assert shares.qt.get(1.0).count == 2 and shares.qt.get(1.0).leave
    worker_heads = [m.view(np.int64) for m in group.messages if m.dtype == np.int64]
    assert [int(h[Field.FLAGS]) for h in worker_heads] == [Flag.NONE, Flag.LEAVE]


def test_a_chunk_split_between_two_epochs_gives_a_worker_at_most_one_share_in_place():
    """A worker releases a slot by writing its ticket, once: had it read both shares of a split
    chunk in place, its first release would free the slot before its second read."""
    import threading

    from fleet.runtime.data.chunks import Flag
    from fleet.runtime.data.shm import Claim

    chunks, group, pool = ChunkLayout(8, (1, 1, 1)), FakeDataComm(size=3), SimpleNamespace(local={0: 0, 1: 1, 2: 2})
    clock = MemberClock(10, done=7)  # 3 rows end the epoch, 5 start the next
    held = []
    sends = GroupSends(group, 4, [False, True, True], pool, (0, 1, 2), lambda test, what: test())
    shares = ShareForwarding(chunks, clock, SampleQueue(64, "Qt"), sends, SimpleNamespace(add=held.append),
                             threading.Event(), timeout_s=5.0)
    slot = chunks.new_buffer()
    write_header(chunks.header(slot), 5, 0, 8)
    chunks.labels(slot)[:] = np.arange(8)
    claim = Claim(owner=9, slot=0, ticket=1)
    shares.forward(5, slot, claim)
    heads = [m.view(np.int64) for m in group.messages if m.size and m.dtype == np.int64]
    in_place = [bool(int(h[Field.FLAGS]) & Flag.IN_SHM) for h in heads]
    assert in_place == [True, True, False, False]  # the first share of each worker only
    assert [int(h[Field.FLAGS]) & Flag.EPOCH_END for h in heads] == [Flag.EPOCH_END] * 2 + [0] * 2
    assert held == [claim] and sorted(claim.readers) == [1, 2] and len(claim.requests) == 2  # rows sent as bytes
    own = [shares.qt.get(1.0) for _ in range(2)]
    assert [(list(s.y), s.epoch_end) for s in own] == [([0], True), ([3, 4], False)]


def test_two_masters_of_one_stream_on_one_rank_each_get_their_regroups():
    """Rank 6 left stream 3 at regroup 5 and joined it again at regroup 6. Its new thread reads
    the coordinator's commands first: it must not take, and drop, the regroup 5 that its old
    (draining) thread needs to learn that it left."""
    from types import SimpleNamespace

    from fleet.runtime.data.layouts import RegroupBox

    def regroup(version, switch):
        return Regroup(StreamLayout(3, version, (0, 1, 2), (4, 3), 53), switch)

    class Ctrl:
        def __init__(self):
            self.sent = deque()

        def improbe(self, source, tag):
            if tag == stream_tag(3) and self.sent:
                command = self.sent.popleft()
                return SimpleNamespace(recv=lambda: command)
            return None

    ctrl = Ctrl()
    box = RegroupBox(ctrl)
    ctrl.sent.extend([regroup(5, 32), regroup(7, 34)])
    assert box.after(3, 6).layout.version == 7  # the new thread (newest: 6)
    assert box.after(3, 4).layout.version == 5  # the old one (newest: 4) still finds its regroup
    assert box.after(3, 7) is None
    ctrl.sent.append(regroup(8, 35))
    assert box.after(3, 7).switch_chunk == 35 and box.after(4, 0) is None


def test_a_joining_master_posts_its_receives_again_from_the_roots_of_the_next_layout():
    """A fleet-adaptive hang: a model joined the stream on rank 5 at chunk 83 (layout 15,
    masters 3, 4, 6, 5) and posted its receive of chunk 84 from rank 3 at once. Layout 16
    (switch 84: rank 3's model converged) made rank 4 the root of chunk 84; the receive from
    rank 3 never matched, rank 4's send never completed, and the stream stopped."""
    comm, preprocessors = FakeDataComm(), (0, 1, 2)
    master = master_stream(comm, 5, StreamLayout(0, 15, preprocessors, (3, 4, 6, 5), 103), first_chunk=83)
    inbox = master.receives.inbox
    master.receives.post_inbox(master.k, master.layouts)
    assert {c: r.source for c, (r, _) in inbox.items()} == {83: 6, 84: 3}
    first = comm.receives[84]
    master._apply(Regroup(StreamLayout(0, 16, preprocessors, (4, 6, 5), 103), 84))
    master.receives.post_inbox(master.k, master.layouts)
    assert first.cancelled and {c: r.source for c, (r, _) in inbox.items()} == {83: 6, 84: 4}
