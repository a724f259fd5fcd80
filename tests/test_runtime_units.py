"""The runtime's pure pieces, without processes: chunks, stream order, queues, books, regroups, launch."""

import ctypes
import os
import shutil
import sys
import threading
from collections import deque
from types import SimpleNamespace

import numpy as np
import pytest

from fleet.errors import UserError
from fleet.runtime.data.chunks import ChunkLayout, Field, StreamOrder, member_end_chunk, share_bounds, write_header
from fleet.runtime.control.accounting import ModelRecord, RunAccount
from fleet.runtime.control.membership import Membership
from fleet.runtime.control.streams import Group, LiveStream
from fleet.runtime.control.rates_source import estimated_profile
from fleet.runtime.control.tuning import RateTuner
from fleet.runtime.launch.mpiexec import allocation_note, find_mpiexec, local_launch_flags, mpiexec_command
from fleet.runtime.protocol import Paused, Regroup, StartMember, StreamLayout, StreamSource, stream_tag
from fleet.runtime.data.queues import Batch, Batcher, SampleQueue, Share
from fleet.runtime.events import first_batch_s
from fleet.runtime.data.shares import GroupSends, MemberClock, ShareForwarding, own_rows
from fleet.runtime.data.stream import MasterStream
from fleet.runtime.data.transport import SlotClaims
from fleet.runtime.train.trainer import GroupTraining, MemberCosts
from fleet.runtime import waiting
from fleet.runtime.waiting import Backoff, WaitTimeout, busy_polling_fits, poll, polling_threads, use_busy_polling
from fleet.schedule import Member, ModelState, Overheads, PolicyError, RateTable, StreamPlan, create_policy
from fleet.schedule.ledger import Ledger
from fleet.spec import parse_spec


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


def test_layout_owner_pairs_preprocessors_with_masters():
    layout = StreamLayout(stream=1, version=0, preprocessors=(0, 9), masters=(3, 5, 7))
    assert [layout.owner(k) for k in range(4)] == [3, 5, 3, 5]
    one = StreamLayout(1, 1, (0, 9, 4), (8,))
    assert {one.owner(k) for k in range(6)} == {8}


def test_the_first_batch_is_the_earliest_member_start_plus_its_start_of_this_run():
    events = [
        {"time": 50.0, "event": "run_start"}, {"time": 51.0, "event": "member_start", "model": "old"},
        {"time": 60.0, "event": "epoch", "model": "old", "start_s": 0.5},  # an earlier run of the directory
        {"time": 100.0, "event": "run_start"},
        {"time": 100.5, "event": "member_start", "model": "a"}, {"time": 100.6, "event": "member_start", "model": "b"},
        {"time": 104.0, "event": "member_start", "model": "c"},
        {"time": 109.0, "event": "epoch", "model": "c", "start_s": 0.1},  # started last, trained first
        {"time": 110.0, "event": "epoch", "model": "a", "start_s": 3.7},
        {"time": 111.0, "event": "epoch", "model": "b", "start_s": 3.0},
        {"time": 112.0, "event": "epoch", "model": "b", "start_s": 0.0},
    ]
    assert first_batch_s(events) == pytest.approx(3.6)  # b: 100.6 + 3.0
    assert first_batch_s(events[:7]) is None  # no member has reported its first batch yet
    assert first_batch_s([]) is None


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


def test_poll_returns_the_first_truthy_value_and_times_out_with_the_reason():
    calls = iter([None, False, 0, 7])
    assert poll(lambda: next(calls), "x", timeout_s=1, backoff=Backoff(1e-5, 1e-4)) == 0
    with pytest.raises(WaitTimeout, match="waiting for the moon"):
        poll(lambda: None, "the moon", timeout_s=0.02, backoff=Backoff(1e-3, 1e-3))


@pytest.mark.parametrize("affinity, node_threads, fits", [
    (16, 12, True),   # the node's polling threads fit the cores this job may use
    (16, 20, False),  # ranks outnumber cores
    (8, 10, False),   # a Slurm job's cgroup of 8 cores on a larger node: its 10 threads share them
    (2, 7, False),    # the 2-core VM with 3 trainers and a preprocessor
])
def test_busy_polling_fits_the_cores_this_job_may_use(monkeypatch, affinity, node_threads, fits):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(affinity)), raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    assert busy_polling_fits(node_threads) is fits


def test_a_trainer_that_decodes_its_own_data_polls_in_one_more_thread(monkeypatch):
    """Baseline's models decode in their trainer (a decoder thread beside its stream and
    training threads): 4 trainers and a preprocessor fit 12 cores with shared streams, not
    with their own decoders."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(12)), raising=False)
    assert polling_threads(4, 1, own_decoding=False) == 9 and busy_polling_fits(9)
    assert polling_threads(4, 1, own_decoding=True) == 13 and not busy_polling_fits(13)


def test_the_polling_choice_reaches_horovods_waits(monkeypatch):
    """tools/horovod-nospin.h reads FLEET_MPI_WAIT: busy keeps Horovod's blocking MPI calls."""
    monkeypatch.setattr(waiting, "HOT", waiting.HOT)
    monkeypatch.setenv("FLEET_MPI_WAIT", "")
    use_busy_polling(True)
    assert os.environ["FLEET_MPI_WAIT"] == "busy" and waiting.HOT is waiting.BUSY
    use_busy_polling(False)
    assert os.environ["FLEET_MPI_WAIT"] == "sleep" and waiting.HOT is waiting.SHARING


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="timer slack is Linux's")
def test_fine_sleeps_sets_the_calling_threads_timer_slack_only():
    """A 20 us sleep of a backoff overran by Linux's default 50 us timer slack."""
    libc = ctypes.CDLL(None)
    get_slack = lambda: libc.prctl(30, 0, 0, 0, 0)  # noqa: E731  PR_GET_TIMERSLACK, nanoseconds
    seen = []

    def worker() -> None:
        libc.prctl(29, 50_000, 0, 0, 0)  # PR_SET_TIMERSLACK: Linux's default
        waiting.fine_sleeps()
        seen.append(get_slack())

    before = get_slack()
    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert seen == [1000] and get_slack() == before


def rates3() -> RateTable:
    return RateTable.from_dict({"schema": 1, "gpus_per_node": 2, "samples_per_epoch": 100, "models": [
        {"id": m, "rates": {"1": r, "2": 1.8 * r}} for m, r in (("a", 100), ("b", 90), ("c", 50))]})


def test_ledger_tracks_streams_gpus_and_rounds():
    ledger = Ledger(rates3(), [3, 3, 3], total_gpus=4, gpus_per_node=2, epochs_done={"c": 1}, paused=["c"])
    assert ledger.model("c").state is ModelState.PAUSED and ledger.model("c").epochs_done == 1
    plan = StreamPlan((Member("a", (0,)), Member("c", (1, 2))))
    ledger.check_launch([plan], "p")
    assert ledger.begin_launch()
    stream = ledger.open_stream()
    for member in plan.members:
        ledger.reserve(member.model, member.gpus, stream)
    view = ledger.view(1.0)
    assert view.free_gpus == (3,) and view.streams[0].members == ("a", "c") and view.round == 0
    rates = rates3()
    assert view.streams[0].pace == min(rates.rate("a", 1), rates.rate("c", 2)) > 0  # planned from the profile
    with pytest.raises(PolicyError, match="GPU 2 for b is not free"):
        ledger.check_launch([StreamPlan((Member("b", (2,)),))], "p")
    with pytest.raises(PolicyError, match="cannot launch a"):
        ledger.check_launch([StreamPlan((Member("a", (3,)),))], "p")
    assert ledger.release("a", ModelState.CONVERGED) == (0,)
    ledger.start_checkpoint("c")
    assert ledger.release("c", ModelState.PAUSED) == (1, 2) and ledger.drained and not ledger.streams
    assert ledger.begin_launch() and ledger.round == 1  # a launch on a drained cluster starts a round
    assert ledger.unfinished == 2


class RecordingLog:
    """An event log and console that keep what they were given."""

    def __init__(self):
        self.logged, self.events, self.banners = [], [], []

    def write(self, event, **fields):
        self.logged.append(event)
        self.events.append((event, fields))

    def banner(self, text):
        self.banners.append(text)

    def member(self, *args):
        pass

    def shared_stream(self, *args):
        pass


def rate_tuner(policy_name: str, checkpoint_s: float, rates: RateTable | None = None,
               epochs: tuple = (3, 3, 3)) -> RateTuner:
    """A `RateTuner` over a real ledger and policy, its log recorded, at a save cost of `checkpoint_s`."""
    rates = rates or rates3()
    ledger = Ledger(rates, epochs, total_gpus=4, gpus_per_node=rates.gpus_per_node)
    costs = Overheads(latency_s=checkpoint_s, bandwidth=float("inf"), planning_s=0.0)
    log = RecordingLog()
    return RateTuner(ledger, create_policy(policy_name), lambda: create_policy(policy_name), lambda: costs, log, log)


def test_measured_rates_are_weighed_only_where_they_can_change_a_plan_and_once_within_ten_percent():
    # baseline and homogeneous never read a rate; fleet-adaptive rescales its own curves by
    # each epoch's measured rate: the coordinator's weighing could not change their plans
    for name in ("baseline", "homogeneous", "fleet-adaptive"):
        blind = rate_tuner(name, checkpoint_s=0.0)
        blind.observe("a", 1, 25.0)
        blind.refine(0.0)
        assert blind.log.logged == [] and blind.ledger.rates == rates3()
    costly = rate_tuner("fleet-g", checkpoint_s=1e6)  # no gain pays for the change
    costly.observe("a", 1, 25.0)
    costly.refine(0.0)
    assert costly.log.logged == ["rates_kept"] and costly.ledger.rates == rates3()
    costly.observe("a", 1, 26.0)  # the proposal moves by 2%: the same verdict, not simulated again
    costly.refine(0.0)
    assert costly.log.logged == ["rates_kept"]
    costly.observe("a", 1, 5.0)  # now by a third: weighed again
    costly.refine(0.0)
    assert costly.log.logged == ["rates_kept", "rates_kept"] and costly.seconds > 0


def test_fleet_hop_takes_measured_rates_unweighed_at_its_hops():
    """Every visit ends with a checkpoint and is planned afresh: new rates cost nothing."""
    tuner = rate_tuner("fleet-hop", checkpoint_s=1e6)  # a weighing could never pay for a change
    tuner.observe("a", 1, 25.0)
    tuner.refine(0.0)
    assert tuner.log.logged == ["rates_refined"] and tuner.ledger.rates.rate("a", 1) == 25.0
    assert tuner.seconds == 0  # nothing simulated
    tuner.observe("a", 1, 25.5)  # within 10% of the table: nothing to adopt
    tuner.refine(0.0)
    assert tuner.log.logged == ["rates_refined"]
    mop = rate_tuner("mop", checkpoint_s=0.0)  # draws at random: never reads a rate
    mop.observe("a", 1, 25.0)
    mop.refine(0.0)
    assert mop.log.logged == [] and mop.ledger.rates == rates3()


def test_estimated_rates_measure_models_that_train_alike_as_one():
    """A sweep's copies of one architecture (they differ in learning rate) get one estimated rate
    and are measured as one, as the profiler would time them: noise in their epoch reports
    cannot pull them apart (and out of one shared stream)."""
    spec = parse_spec({"name": "s", "data": {"source": "digits"}, "models": [
        {"family": "mlp", "name": "slow", "train": {"lr": 0.1}},
        {"family": "mlp", "name": "fast", "train": {"lr": 0.01}},
        {"family": "mlp", "name": "wide", "params": {"hidden": [512]}}]})
    rates = RateTable.from_dict(estimated_profile(spec, 1000, {"slow": 1000, "fast": 1000, "wide": 5000}))
    assert [p.extra.get("timed_as") for p in rates.models] == [None, "slow", None]
    tuner = RateTuner(Ledger(rates, (3, 3, 3), total_gpus=2, gpus_per_node=1), create_policy("fleet-hop"),
                      lambda: create_policy("fleet-hop"), Overheads, RecordingLog(), RecordingLog())
    tuner.observe("slow", 1, 40.0)
    tuner.observe("fast", 1, 60.0)
    tuner.refine(0.0)
    assert tuner.ledger.rates.rate("slow", 1) == tuner.ledger.rates.rate("fast", 1) == pytest.approx(50.0)


def test_fleet_g_s_rates_are_weighed_only_once_its_cluster_is_drained():
    """FLEET-G plans only when no model runs or checkpoints: a weighing before then is wasted."""
    tuner = rate_tuner("fleet-g", checkpoint_s=0.01)
    ledger = tuner.ledger
    ledger.begin_launch()
    stream = ledger.open_stream()
    ledger.reserve("a", (0,), stream)
    ledger.reserve("b", (1,), stream)
    tuner.observe("b", 1, 22.0)
    ledger.release("a", ModelState.CONVERGED)
    tuner.refine(0.0)  # b still runs
    ledger.start_checkpoint("b")
    tuner.refine(0.0)  # b still saves
    assert tuner.log.logged == [] and tuner.seconds == 0
    ledger.release("b", ModelState.PAUSED)
    tuner.refine(0.0)
    assert tuner.log.logged in (["rates_refined"], ["rates_kept"]) and tuner.seconds > 0


def test_fleet_g_s_rates_are_weighed_only_when_they_change_the_plan_about_to_be_made():
    tuner = rate_tuner("fleet-g", checkpoint_s=0.01)
    tuner.observe("b", 1, 100.0)  # 11% faster than profiled: still matched with a
    tuner.refine(0.0)
    assert tuner.log.logged == [] and tuner.rejected is None and tuner.ledger.rates == rates3()
    tuner.observe("b", 1, 40.0)  # averaged, 70: b no longer runs at a's side
    tuner.refine(0.0)
    assert tuner.log.logged in (["rates_refined"], ["rates_kept"])


def test_measured_rates_are_weighed_at_the_checkpoint_cost_the_run_measured():
    """b trains 11% slower than profiled: planned on that, FLEET-G's schedule is 0.24 s shorter but
    has two rounds more. At this run's 0.05-s saves that pays; the simulator's default costs (a
    cluster's 5 s per checkpoint and per restore) would have priced each extra round at ~10 s."""
    rates = RateTable.from_dict({"schema": 1, "gpus_per_node": 4, "samples_per_epoch": 1000, "models": [
        {"id": m, "rates": {str(k + 1): r * f for k, f in enumerate((1.0, 1.8, 2.4, 2.8))}}
        for m, r in (("a", 200), ("b", 200), ("c", 400))]})
    tuner = rate_tuner("fleet-g", checkpoint_s=0.05, rates=rates, epochs=(4, 2, 4))
    tuner.observe("b", 1, 178.0)
    tuner.refine(0.0)
    assert tuner.log.logged == ["rates_refined"] and tuner.ledger.rates.rate("b", 1) == 178.0
    fresh = rate_tuner("fleet-g", checkpoint_s=0.05, rates=rates, epochs=(4, 2, 4))
    fresh.observe("b", 1, 178.0)
    _, verdict = fresh.weigh(0.0)
    assert verdict.cost_s == pytest.approx(0.1)  # one model moved: a save and a restore
    assert 0.1 < verdict.gain_s < 1.0, verdict


def test_mpiexec_command_for_one_and_several_nodes():
    spec = parse_spec({"name": "q", "data": {"source": "digits"}, "models": [{"family": "mlp"}],
                       "cluster": {"nodes": 2, "gpus_per_node": 3, "preprocessors_per_node": 2}})
    command = mpiexec_command(spec, "q.yaml", ["mpiexec", "-launcher", "fork"], "/py", quiet=True)
    assert command == ["mpiexec", "-launcher", "fork", "-n", "10", "/py", "-m", "fleet", "train", "q.yaml",
                       "--run-dir", "runs/q", "--ranks-per-node", "5", "--quiet"]
    assert local_launch_flags("HYDRA build details:\n Version: 5.0") == ["-launcher", "fork"]
    assert local_launch_flags("mpiexec (Open MPI) 5.0.3") == ["--oversubscribe"]
    assert local_launch_flags("something else") == []


def test_a_multi_node_allocation_gets_a_note_that_fleet_run_stays_on_this_node():
    assert allocation_note({}) is None
    assert allocation_note({"SLURM_JOB_ID": "9", "SLURM_JOB_NUM_NODES": "1"}) is None
    assert allocation_note({"SLURM_JOB_ID": "9", "SLURM_JOB_NUM_NODES": "4"}) == (
        "fleet: slurm job 9 has 4 nodes; this command starts every rank on this one "
        "(for all of them: `fleet submit`, or `fleet train` under srun/jsrun)")
    assert allocation_note({"LSB_JOBID": "5", "LSB_MCPU_HOSTS": "login 1 a 40 b 40"}).startswith(
        "fleet: lsf job 5 has 3 nodes;")


def test_fleet_mpiexec_chooses_the_launcher_and_a_wrong_one_is_named(tmp_path):
    beside = tmp_path / "venv" / "bin"
    beside.mkdir(parents=True)
    (beside / "mpiexec").write_text("")
    python = str(beside / "python")
    assert find_mpiexec(python, {}) == str(beside / "mpiexec")
    assert find_mpiexec(python, {"FLEET_MPIEXEC": "/bin/sh"}) == "/bin/sh"
    assert find_mpiexec(python, {"FLEET_MPIEXEC": "sh"}) == shutil.which("sh")
    with pytest.raises(UserError, match=r"^FLEET_MPIEXEC: '/no/mpirun' is not an executable file or a command on PATH$"):
        find_mpiexec(python, {"FLEET_MPIEXEC": "/no/mpirun"})


class OneNode:
    """A topology fake: preprocessor ranks first, then a trainer rank per GPU, all on node 0."""

    def __init__(self, preprocessors: tuple[int, ...], trainer_of_gpu: dict[int, int]):
        self.preprocessors, self.trainer_of_gpu = preprocessors, trainer_of_gpu

    def trainer_rank(self, gpu: int) -> int:
        return self.trainer_of_gpu[gpu]

    def preprocessor_ranks(self, node: int | None = None) -> list[int]:
        return list(self.preprocessors)

    def node_of(self, rank: int) -> int:
        return 0


class RecordedMembership:
    """A `Membership` over a one-node fake topology whose commands and log are recorded."""

    def __init__(self, run_dir, ledger, preprocessors=(0,), trainer_of_gpu=None, epochs=3):
        ctx = SimpleNamespace(
            topology=OneNode(preprocessors, trainer_of_gpu or {g: g + len(preprocessors) for g in range(4)}),
            run_dir=run_dir, epoch_limits={m: epochs for m in "abcd"}, spec=SimpleNamespace(seed=1),
            train_idx=np.arange(80), chunk_samples=8,
        )
        self.sent, self.log = [], RecordingLog()
        self.account = RunAccount({m: ModelRecord(family="mlp", epochs=2) for m in "abcd"})
        self.account.new_round(0)
        send = lambda command, rank, tag: self.sent.append((command, rank))  # noqa: E731
        self.membership = Membership(ctx, ledger, self.account, send, self.log, self.log)

    def started(self) -> list[tuple[str, int]]:
        """(model, first chunk) of each group started, as its master got it."""
        return [(c.model, c.first_chunk) for c, rank in self.sent if isinstance(c, StartMember) and rank == c.ranks[0]]

    def names(self) -> list[str]:
        return [type(command).__name__ for command, _ in self.sent]


def rates4() -> RateTable:
    return RateTable.from_dict({"schema": 1, "gpus_per_node": 4, "samples_per_epoch": 80, "models": [
        {"id": m, "rates": {"1": 100.0}} for m in "abcd"]})


def test_a_group_joining_on_the_master_rank_of_a_leaving_group_waits_for_the_next_regroup(tmp_path):
    recorded = RecordedMembership(tmp_path, Ledger(rates4(), [3] * 4, total_gpus=4, gpus_per_node=4))
    live = LiveStream(StreamLayout(0, 0, (0,), (1, 3)), StreamSource(1, 0, 0, 8), 0)
    live.groups = {"a": Group("a", (1, 2), (0, 1), 1), "b": Group("b", (3,), (2,), 2)}
    live.leaving = {"b"}
    live.joining = [Group("c", (3,), (2,), 3), Group("d", (4,), (3,), 4)]
    recorded.membership.regroup(live, switch=96)
    assert live.layout.masters == (1, 4) and live.layout.version == 1
    assert recorded.started() == [("d", 96)]  # c would share rank 3 with b's leaving stream thread
    assert [g.model for g in live.joining] == ["c"] and live.pausing  # and asks for the next regroup
    live.awaiting = {}
    recorded.membership.regroup(live, switch=97)
    assert live.layout.masters == (1, 4, 3) and recorded.started()[-1] == ("c", 97) and not live.joining


def test_a_deferred_join_that_would_leave_its_stream_without_a_master_starts_a_stream_of_its_own(tmp_path):
    # Every member leaves and the one joining group is on a leaving master's rank: a layout
    # with no master would end the stream for its preprocessors before the join (a hang, seen
    # under fleet-adaptive), so the stream ends and the group gets a new one.
    ledger = Ledger(rates4(), [3] * 4, total_gpus=4, gpus_per_node=4)
    old = ledger.open_stream()
    for model, gpu in (("a", 0), ("b", 1), ("c", 2)):
        ledger.reserve(model, (gpu,), old)  # c as the driver reserves a join
    for model in ("a", "b"):
        ledger.start_checkpoint(model)
    recorded = RecordedMembership(tmp_path, ledger, preprocessors=(0, 1), trainer_of_gpu={0: 2, 1: 3, 2: 3})
    live = LiveStream(StreamLayout(old, 0, (0, 1), (2, 3)), StreamSource(1, 0, 0, 8), 0)
    recorded.membership.books.streams[old] = live
    live.groups = {"a": Group("a", (2,), (0,), 1), "b": Group("b", (3,), (1,), 2)}
    live.leaving = {"a", "b"}
    live.joining = [Group("c", (3,), (1,), 3)]
    recorded.membership.regroup(live, switch=43)
    assert live.layout.masters == () and not live.joining and not live.pausing
    assert recorded.names()[:4] == ["Regroup"] * 4  # old masters 2, 3; preprocessors 0, 1
    assert ("restream", {"ended": old, "stream": 1, "members": ["c"]}) in recorded.log.events
    (start,) = [c for c, _ in recorded.sent if isinstance(c, StartMember)]
    assert (start.model, start.layout.stream, start.first_chunk) == ("c", 1, 0)
    assert ledger.model("c").stream == 1 and old not in ledger.streams


def test_ledger_moves_a_reserved_model_to_another_stream():
    ledger = Ledger(rates3(), [3, 3, 3], total_gpus=4, gpus_per_node=2)
    old = ledger.open_stream()
    ledger.reserve("a", (0,), old)
    new = ledger.open_stream()
    ledger.move("a", new)
    assert ledger.model("a").stream == new and ledger.model("a").gpus == (0,)
    assert old not in ledger.streams and ledger.streams[new] == ["a"]


def test_checkpointing_a_model_whose_join_is_pending_drops_the_join(tmp_path):
    # The checkpoint signal (or an end of round) between a join and its regroup: the joining
    # group never started, so it gets no command; it leaves as if checkpointed at once.
    ledger = Ledger(rates3(), [3, 3, 3], total_gpus=4, gpus_per_node=2)
    stream = ledger.open_stream()
    recorded = RecordedMembership(tmp_path, ledger)
    live = LiveStream(StreamLayout(stream, 0, (3,), (1,)), StreamSource(1, 0, 0, 8), 0)
    live.groups = {"a": Group("a", (1,), (0,), 1)}
    live.joining = [Group("c", (2,), (1,), 2)]
    membership = recorded.membership
    membership.books.streams[stream] = live
    recorded.account.record_member("c", (1,), stream)
    membership.checkpoint("c")
    assert not live.joining and recorded.sent == [] and membership.books.groups_open == 1
    assert recorded.account.plan_rounds[-1]["members"] == []
    (left,) = membership.local_reports
    assert (left.model, left.converged, left.epochs) == ("c", False, 2)
    membership.checkpoint("a")  # a started member: the command, then a pause of the stream
    assert [(type(c).__name__, rank) for c, rank in recorded.sent] == [("CheckpointModel", 1), ("Pause", 3)]


def test_checkpointing_a_model_takes_it_off_its_new_stream_while_the_old_one_still_drains(tmp_path):
    # Seen in a 32-model FLEET-G run: a model checkpointed at the end of round 4 started in
    # round 5's stream before round 4's stream had its regroup; at round 5's end the checkpoint
    # was booked on the old stream, the new one kept the model's rank as its master, and that
    # rank waited for a regroup that never came (the job timed out after every model finished).
    ledger = Ledger(rates3(), [3, 3, 3], total_gpus=4, gpus_per_node=2)
    old, new = ledger.open_stream(), ledger.open_stream()
    recorded = RecordedMembership(tmp_path, ledger)
    membership = recorded.membership
    draining = LiveStream(StreamLayout(old, 0, (3,), (1,)), StreamSource(1, 0, 0, 8), 0)
    draining.groups, draining.leaving, draining.pausing = {"a": Group("a", (1,), (0,), 1)}, {"a"}, True
    running = LiveStream(StreamLayout(new, 0, (3,), (1,)), StreamSource(1, 0, 0, 8), 1)
    running.groups = {"a": Group("a", (1,), (0,), 2)}
    membership.books.streams.update({old: draining, new: running})
    membership.checkpoint("a")
    assert running.leaving == {"a"} and running.pausing
    assert [(type(c).__name__, rank) for c, rank in recorded.sent] == [("CheckpointModel", 1), ("Pause", 3)]
    membership.checkpoint("a")  # already leaving both: nothing more
    assert len(recorded.sent) == 2


def test_the_console_names_slots_by_device_and_a_shared_stream_by_its_members():
    import io

    from fleet.runtime.control.console import Console

    for device, slot in (("cpu", "cpu slot 0-1"), ("cuda", "GPU 0-1"), ("emulated", "emulated GPU 0-1")):
        out = io.StringIO()
        console = Console(stream=out, device=device)
        console.shared_stream(3, ["a", "b", "c"])
        console.shared_stream(4, ["d"])  # one model: nothing shared, nothing said
        console.member("a", (0, 1), 3, resume=False)
        lines = out.getvalue().splitlines()
        assert len(lines) == 2, lines
        assert lines[0].endswith("stream 3: 3 models share one decoded stream: a, b, c")
        assert lines[1].endswith(f"a                  starts on {slot} (stream 3)")


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


def test_a_switch_is_never_past_the_stream_end_and_a_join_moves_the_end(tmp_path):
    # Preprocessors stop at the end (chunk 20), so a switch past it would wait for chunks that
    # never come; a join moves the end to where its model reaches its max_epochs (one epoch
    # of 80 samples: 10 chunks of 8).
    recorded = RecordedMembership(tmp_path, Ledger(rates4(), [1] * 4, total_gpus=4, gpus_per_node=4),
                                  preprocessors=(5, 6), epochs=1)
    membership = recorded.membership
    live = LiveStream(StreamLayout(0, 0, (5, 6), (1, 2), end=20), StreamSource(1, 0, 0, 8), 0)
    membership.books.streams[0] = live
    live.groups = {"a": Group("a", (1,), (0,), 1), "b": Group("b", (2,), (1,), 2)}
    live.leaving, live.pausing, live.awaiting = {"a"}, True, {5: 20, 6: -1}
    membership.on_paused(Paused(0, 1, 6, 21))
    assert live.layout.masters == (2,) and live.last_switch == 20 and live.layout.end == 20
    live.joining, live.pausing, live.awaiting = [Group("c", (3,), (2,), 3)], True, {5: 20, 6: 21}
    membership.regroup(live, switch=20)  # the same switch: nothing was decoded at or past it
    assert live.layout.masters == (2, 3) and live.layout.end == 30 and recorded.started() == [("c", 20)]
    live.leaving, live.pausing, live.awaiting = {"b"}, True, {5: 24, 6: -1}
    membership.on_paused(Paused(0, 3, 6, 25))
    assert live.last_switch == 27 and live.layout.end == 30  # before the end: as before


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


class QuietLink:
    """A master's `CoordinatorLink` that has no command for it and sends nothing."""

    def poll_commands(self):
        return False  # the checkpoint command has not been polled when the leave arrives

    def maybe_progress(self, epochs, samples, since):
        pass


class ScriptedTraining:
    """`GroupTraining._train` on one master whose batches come from a list; steps and
    epoch ends are recorded instead of trained."""

    _train = GroupTraining._train

    def __init__(self, batches):
        self.batches, self.is_master, self.size, self.stop_requested = list(batches), True, 1, False
        self.steps, self.epochs_closed, self.visit = [], 0, None
        self.link, self.tracker, self.totals = QuietLink(), SimpleNamespace(epochs=0), SimpleNamespace(samples=0, started=0)

    def _next_batch(self, batcher, stream):
        return self.batches.pop(0)

    def _step(self, batch, count, total):
        self.steps.append(count)

    def _end_epoch(self):
        self.epochs_closed += 1
        return False


def test_a_leave_stops_the_group_and_never_closes_an_epoch():
    def batch(n, epoch_end=False, leave=False):
        return Batch(np.zeros((n, 2), np.float32), np.zeros(n, np.int64), epoch_end=epoch_end, leave=leave)

    training = ScriptedTraining([batch(4), batch(4, epoch_end=True), batch(4), batch(0, leave=True)])
    assert training._train(batcher=None, stream=None) is False
    assert training.steps == [4, 4, 4] and training.epochs_closed == 1  # the second epoch was cut short


def test_a_master_reports_its_leave_before_its_group_closes_the_collective(monkeypatch):
    """The next round is planned, and its data decoded, while the group closes its collective."""
    import fleet.runtime.train.trainer as trainer
    from types import SimpleNamespace

    calls = []

    class Comm:
        def Free(self):
            calls.append("free")

    class Training:
        def __init__(self, ctx, start, group_comm):
            self.collective = SimpleNamespace(close=lambda: calls.append("close"))

        def run(self):
            calls.append("checkpointed")
            return "left"

    monkeypatch.setattr(trainer, "create_group_comm", lambda parent, ranks, uid: Comm())
    monkeypatch.setattr(trainer, "GroupTraining", Training)
    monkeypatch.setattr(trainer, "send_object", lambda comm, obj, dest, tag, what, timeout: calls.append(f"send {obj}"))
    start = SimpleNamespace(model="m", ranks=(3, 4), group_uid=1)
    for rank, expected in [(3, ["checkpointed", "send left", "close", "free"]), (4, ["checkpointed", "close", "free"])]:
        calls.clear()
        ctx = SimpleNamespace(rank=rank, who=SimpleNamespace(role=None), group_parent=None, ctrl=None, timeout_s=1.0)
        trainer.TrainerLoop(ctx)._run_member(start)
        assert calls == expected and ctx.who.role == "trainer"


def test_each_checkpoint_is_counted_once_and_weighed_by_its_group():
    """The master reports the save seconds since its last report; the coordinator sums them,
    and counts each save's seconds once per trainer of the group (they wait for it)."""
    from types import SimpleNamespace

    costs = MemberCosts()
    reported = []
    for save_s in (0.5, 0.25, 0.125):  # epoch 1, epoch 2, the leave
        costs.saved(save_s)
        reported.append(costs.take_checkpoint_s())
    assert reported == [0.5, 0.25, 0.125]

    books = RunAccount({})
    for seconds, group_size in zip(reported, (2, 2, 2)):
        books.count_checkpoint(seconds, group_size)
    books.count_checkpoint(0.0, 3)  # a cancelled join: nothing saved
    assert books.checkpoint_s == 0.875 and books.checkpoint_gpu_s == 1.75 and books.saves == 3
    assert books.measured_overheads().checkpoint_s(None) == pytest.approx(0.875 / 3)


def test_a_trainer_that_starves_says_what_its_stream_thread_waits_for():
    """The training thread's wait on Qt times out first; the cause is the stream thread's wait."""
    from types import SimpleNamespace

    from fleet.runtime.data.stream import StreamThread

    thread = StreamThread("stream-3", SampleQueue(10, "Qt of m"))
    thread.ctx = SimpleNamespace(timeout_s=0.2)
    seen = []

    def never():
        seen.append(thread.describe())
        return None

    with pytest.raises(WaitTimeout, match="chunk 36 of stream 3"):
        thread._poll(never, "chunk 36 of stream 3 from master rank 5")
    assert seen[0] == "its stream thread waits for chunk 36 of stream 3 from master rank 5"
    assert thread.describe() == "its stream thread is not waiting"
    thread.waiting_for = "chunk 36 of stream 3 from master rank 5"

    class Starved:
        def get(self):
            raise WaitTimeout("timed out after 0.2 s waiting for samples in Qt of m")

    group = SimpleNamespace(ctx=SimpleNamespace(draining=[]))
    with pytest.raises(WaitTimeout, match=r"samples in Qt of m; its stream thread waits for chunk 36 of stream 3"):
        GroupTraining._next_batch(group, Starved(), thread)
    old = StreamThread("stream-3", SampleQueue(10, "Qt of old"))
    old.waiting_for = "regroup 6 of stream 3 from the coordinator"
    group.ctx.draining = [old]
    with pytest.raises(WaitTimeout, match=r"rank 5; the draining stream-3 of its last group waits for regroup 6"):
        GroupTraining._next_batch(group, Starved(), thread)


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


def test_a_member_reports_its_start_once():
    """From the StartMember to the first batch: set-up, restore and the stream's first data.
    The coordinator's weighing charges the mean to every start it simulates."""
    from types import SimpleNamespace

    costs = MemberCosts(created=10.0)
    assert costs.take_start_s() == 0.0  # no batch yet (a leave before any data): nothing to report
    costs.first_batch_came(when=10.25)
    costs.first_batch_came(when=11.0)  # only the first counts
    assert costs.take_start_s() == 0.25 and costs.take_start_s() == 0.0


def test_a_device_override_is_the_spec_s_enum():
    """`--device emulated` used to leave a plain string where the runtime reads `.value`."""
    from fleet.runtime.main import with_device
    from fleet.spec import Device

    spec = parse_spec({"name": "x", "data": {"source": "digits"}, "models": [{"family": "mlp"}]})
    overridden = with_device(spec, "emulated")
    assert overridden.cluster.device is Device.EMULATED and overridden.cluster.device.value == "emulated"


def test_tensorboard_scalars_are_read_back_by_tensorboard_itself(tmp_path):
    """The hand-written event files: CRC-32C of the format's check value, and tensorboard's
    reader gets every tag at every step, also after a second writer (a resumed job) appends."""
    from fleet.report.tensorboard import ScalarBoard, crc32c

    assert crc32c(b"123456789") == 0xE3069283  # the standard check value of CRC-32C
    accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    for first, last in ((1, 2), (3, 4)):  # two jobs, as a requeued run writes
        board = ScalarBoard(tmp_path)
        for epoch in range(first, last + 1):
            board.epoch(SimpleNamespace(model="m", epoch=epoch, train_loss=1 / epoch, val_loss=2 / epoch,
                                        val_accuracy=0.1 * epoch, lr=0.05, samples_per_s=1e3))
    reader = accumulator.EventAccumulator(str(tmp_path / "m"))
    reader.Reload()
    assert [(s.step, round(s.value, 6)) for s in reader.Scalars("accuracy/val")] == [(1, 0.1), (2, 0.2), (3, 0.3), (4, 0.4)]
    assert [s.value for s in reader.Scalars("lr")] == [pytest.approx(0.05)] * 4
