"""Rank 0 without processes: the ledger, rate tuning, stream membership and regroups, the
console and the TensorBoard scalars."""

from types import SimpleNamespace

import numpy as np
import pytest

from fleet.runtime.control.accounting import ModelRecord, RunAccount
from fleet.runtime.control.membership import Membership
from fleet.runtime.control.streams import Group, LiveStream
from fleet.runtime.protocol import MemberLeft, Paused, StartMember, StreamLayout, StreamSource
from fleet.schedule import ModelState, RateTable
from fleet.schedule.ledger import Ledger


def rates3() -> RateTable:
    return RateTable.from_dict({"schema": 1, "gpus_per_node": 2, "samples_per_epoch": 100, "models": [
        {"id": m, "rates": {"1": r, "2": 1.8 * r}} for m, r in (("a", 100), ("b", 90), ("c", 50))]})


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
            run_dir=run_dir, epoch_limits={m: epochs for m in "abcd"},
            spec=SimpleNamespace(seed=1, model=lambda model_id: SimpleNamespace(group=None, search=None)),
            train_idx_of=lambda group: np.arange(80), chunk_samples=8,
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


def test_a_runs_record_tells_fresh_starts_from_joins_into_running_streams(tmp_path):
    # a join's start waits for its stream's chunks, which predictions price at the stream's pace:
    # the calibration of a later run takes the fresh starts' mean, not one swollen by the joins
    recorded = RecordedMembership(tmp_path, Ledger(rates4(), [3] * 4, total_gpus=4, gpus_per_node=4))
    live = LiveStream(StreamLayout(0, 0, (0,), (1,)), StreamSource(1, 0, 0, 8), 0)
    live.groups = {"a": Group("a", (1,), (0,), 1)}
    live.joining = [Group("b", (2,), (1,), 2)]
    recorded.membership.regroup(live, switch=12)
    account = recorded.account
    assert account.joins == {"b"}
    for model, start_s in (("a", 0.1), ("b", 0.7), ("c", 0.3)):
        account.left(MemberLeft(model, 0, 1, True, 2, 0, 1.0, 0.0, 10, start_s=start_s))
    record = account.measured_costs(makespan=5.0)
    assert record["start_s"] == pytest.approx(1.1 / 3) and record["fresh_start_s"] == pytest.approx(0.2)
    assert account.joins == set()
    account.joined(["d"])  # a join that leaves before any data: its next start is not taken for a join
    account.left(MemberLeft("d", 0, 1, False, 0, 0, 0.0, 0.0, 10, start_s=0.0))
    assert account.joins == set() and account.starts == 3


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
    assert ledger.release("c", ModelState.CONVERGED) == (2,)  # its GPU held once: free when it ends


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
