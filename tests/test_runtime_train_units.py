"""Trainer ranks without processes: a group's training loop and its leave, the costs a member
reports, and what a starved trainer says."""

from types import SimpleNamespace

import numpy as np
import pytest

from fleet.runtime.control.accounting import RunAccount
from fleet.runtime.data.queues import Batch, SampleQueue
from fleet.runtime.train.trainer import EpochEnd, GroupTraining, MemberCosts
from fleet.runtime.waiting import WaitTimeout


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
        return EpochEnd.GO_ON


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


def test_a_member_reports_its_start_once():
    """From the StartMember to the first batch: set-up, restore and the stream's first data.
    The coordinator's weighing charges the mean to every start it simulates."""
    costs = MemberCosts(created=10.0)
    assert costs.take_start_s() == 0.0  # no batch yet (a leave before any data): nothing to report
    costs.first_batch_came(when=10.25)
    costs.first_batch_came(when=11.0)  # only the first counts
    assert costs.take_start_s() == 0.25 and costs.take_start_s() == 0.0
