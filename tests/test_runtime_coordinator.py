"""The coordinator (rank 0's world of the policy driver) in process, without MPI.

A fake control communicator plays the other ranks from a script, as torch.distributed.elastic
tests its agent with a fake: preprocessors answer `Pause` and end a stream when its last master
leaves it; a group's master reports an epoch whenever the coordinator has nothing else to read
(the models in training take turns), leaves at the `Regroup` that drops it (`MemberLeft`), and
with partitioned data ends each visit (`VisitEnded`). What the coordinator decides through its
`Driver` is then checked against the script: every model trains exactly its epochs, rounds end
with checkpoints, visits follow Cerebro's rules, and `policy: auto` hands over as the simulator
predicts.
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import pytest

import switch_case
from fleet.runtime.context import RunContext
from fleet.runtime.control.accounting import ModelRecord
from fleet.runtime.control.console import Console
from fleet.runtime.control.coordinator import Coordinator
from fleet.runtime.control.visits import read_visits
from fleet.runtime.events import EventLog
from fleet.runtime.launch.topology import assign_roles
from fleet.runtime.protocol import (
    CheckpointModel,
    EpochReport,
    MemberLeft,
    Pause,
    Paused,
    Regroup,
    StartMember,
    StartStream,
    StreamDone,
    VisitEnded,
)
from fleet.runtime.waiting import RankIdentity
from fleet.schedule import RateTable, create_policy
from fleet.schedule.adapting import simulate_auto
from fleet.schedule.choice import reconsider, switch_targets
from fleet.schedule.ledger import Ledger
from fleet.schedule.scenario import Cluster, Scenario
from fleet.spec import parse_spec
from preprocess.make import make_synthetic
from preprocess.partition import partition_dataset


class _Sent:
    """A request that is complete at once (what `send_object` waits on)."""

    def Test(self, status=None) -> bool:  # noqa: N802 - mpi4py's name
        return True


@dataclass
class _Message:
    report: object

    def recv(self) -> object:
        return self.report


@dataclass
class _Member:
    """A group in training, as its master would report it."""

    model: str
    stream: int
    uid: int
    master: int
    partition: int | None
    leaving: bool = False  # asked to checkpoint, or converged: trains no more
    visit_ended: bool = False  # partitioned data: its pass over the partition is done


@dataclass
class FakeRanks:
    """The control communicator as rank 0 sees it; the other ranks played from a script.

    Args:
        epochs: each model's epochs to its own stop rule.
        rates: each model's measured samples/s on one GPU (its epoch reports say so).
        partitions: partitions of the data (0: whole data).

    Attributes:
        sent: every command, as ``(command, rank)``.
        done: each model's epochs trained, checkpointed or not.
        visited: each model's partitions visited in its current epoch.
    """

    epochs: dict[str, int]
    rates: dict[str, float]
    partitions: int = 0
    sent: list = field(default_factory=list)
    done: dict[str, int] = field(default_factory=dict)
    visited: dict[str, set] = field(default_factory=dict)
    inbox: deque = field(default_factory=deque)
    training: list[_Member] = field(default_factory=list)
    streams: dict[int, tuple[int, ...]] = field(default_factory=dict)  # stream -> its preprocessors
    next_chunk: int = 0

    # -- the communicator's face -----------------------------------------------------------

    def isend(self, command, dest: int, tag: int) -> _Sent:
        self.sent.append((command, dest))
        self._take(command, dest)
        return _Sent()

    def improbe(self, tag: int) -> _Message | None:
        if not self.inbox:
            self._advance()
        return _Message(self.inbox.popleft()) if self.inbox else None

    # -- the ranks ---------------------------------------------------------------------------

    def _take(self, command, rank: int) -> None:
        if isinstance(command, StartStream):
            self.streams[command.layout.stream] = command.layout.preprocessors
        elif isinstance(command, StartMember) and rank == command.ranks[0]:
            self.done.setdefault(command.model, 0)
            self.training.append(_Member(command.model, command.layout.stream, command.group_uid, rank,
                                         command.source.partition))
        elif isinstance(command, CheckpointModel):
            self._member(command.model).leaving = True
        elif isinstance(command, Pause):
            self.next_chunk += 1
            self.inbox.append(Paused(command.stream, command.version, rank, self.next_chunk))
        elif isinstance(command, Regroup):
            self._regroup(command, rank)

    def _regroup(self, command: Regroup, rank: int) -> None:
        stream = command.layout.stream
        dropped = [m for m in self.training if m.stream == stream and m.master == rank
                   and rank not in command.layout.masters]
        for member in dropped:  # the master leaves at the switch
            self.training.remove(member)
            self.inbox.append(self._left(member))
        if rank in self.streams.get(stream, ()) and not command.layout.masters:  # a preprocessor
            self.inbox.append(StreamDone(stream, rank, decoded=100))

    def _left(self, member: _Member) -> MemberLeft:
        converged = self.done[member.model] >= self.epochs[member.model]
        visit = member.partition if member.visit_ended else None
        return MemberLeft(member.model, member.stream, member.uid, converged, self.done[member.model],
                          self._epoch_samples(member.model), gpu_seconds=1.0, checkpoint_s=0.01, parameters=1000,
                          visited=visit)

    def _epoch_samples(self, model: str) -> int:
        """Samples trained in the model's current epoch: none at an epoch's end, else a visit's."""
        return 50 * len(self.visited.get(model, ()))

    def _advance(self) -> None:
        """The next member in training (round robin) ends an epoch, or with partitioned data a visit."""
        for member in list(self.training):
            if not member.leaving:
                self.training.remove(member)
                self.training.append(member)  # its turn is over
                (self._visit if member.partition is not None else self._epoch)(member)
                return

    def _epoch(self, member: _Member) -> None:
        self.done[member.model] += 1
        self.inbox.append(self._report(member))
        member.leaving = self.done[member.model] >= self.epochs[member.model]

    def _visit(self, member: _Member) -> None:
        seen = self.visited.setdefault(member.model, set())
        assert member.partition not in seen, f"{member.model} visits partition {member.partition} twice in an epoch"
        seen.add(member.partition)
        ended = len(seen) == self.partitions
        if ended:
            seen.clear()
            self.done[member.model] += 1
            self.inbox.append(self._report(member))
        member.leaving, member.visit_ended = True, True
        if self.done[member.model] < self.epochs[member.model]:
            self.inbox.append(VisitEnded(member.model, member.stream, self.done[member.model],
                                         self._epoch_samples(member.model)))

    def _report(self, member: _Member) -> EpochReport:
        last = self.done[member.model] >= self.epochs[member.model]
        rate = self.rates[member.model]
        return EpochReport(member.model, member.stream, self.done[member.model], train_loss=1.0, val_loss=1.0,
                           val_accuracy=0.5, samples_per_s=rate, stream_samples_per_s=rate, lr=0.1, epoch_s=1.0,
                           checkpoint_s=0.01, stop_reason="max_epochs" if last else None)

    def _member(self, model: str) -> _Member:
        return next(m for m in self.training if m.model == model)


def spec_of(models, gpus: int, data: dict | None = None):
    return parse_spec({"name": "c", "data": data or {"source": "digits"}, "seed": 1,
                       "models": [{"family": "mlp", "name": m} for m in models],
                       "cluster": {"nodes": 1, "gpus_per_node": gpus, "preprocessors_per_node": 1},
                       "runtime": {"timeout_s": 20}})


def coordinator(tmp_path: Path, spec, ranks: FakeRanks, ledger: Ledger, policy: str, signal=None,
                **auto) -> Coordinator:
    """A coordinator on one node (a preprocessor, then a trainer per GPU) over `ranks`."""
    topology = assign_roles([0] * (1 + spec.cluster.gpus_per_node), spec.cluster)
    ctx = RunContext(spec, world=None, ctrl=ranks, data_parent=None, group_parent=None, topology=topology,
                     who=RankIdentity(0), device="cpu", run_dir=str(tmp_path), checkpoint_signal=signal)
    records = {m.id: ModelRecord(family=m.family) for m in spec.models}
    named = partial(create_policy, seed=0)
    return Coordinator(ctx, named(policy), ledger, records, EventLog(tmp_path / "events.jsonl"),
                       Console(quiet=True), make_policy=lambda: named(policy), policy_named=named, **auto)


def profile(rates: dict[str, float], samples: int, gpus: int) -> RateTable:
    return RateTable.from_dict({"schema": 1, "gpus_per_node": gpus, "samples_per_epoch": samples, "models": [
        {"id": m, "rates": {str(k): r * k * 0.9 ** (k - 1) for k in range(1, gpus + 1)}} for m, r in rates.items()]})


def events(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


def test_rounds_end_with_checkpoints_and_every_model_trains_exactly_its_epochs(tmp_path):
    """fleet-g on 2 GPUs, six models of 1 to 4 epochs: a round ends when fewer than alpha x 2
    GPUs are busy, its running models are checkpointed and resumed in a later round; the run
    ends when the last model converged, every group gone and every stream ended."""
    epochs = dict(zip("abcdef", (1, 4, 2, 3, 1, 2)))
    rates = {m: 100.0 for m in epochs}
    spec = spec_of(epochs, gpus=2)
    ranks = FakeRanks(epochs, rates)
    ledger = Ledger(profile(rates, 1000, 2), [float(e) for e in epochs.values()], 2, 2)
    coord = coordinator(tmp_path, spec, ranks, ledger, "fleet-g")
    coord.run()
    assert coord.driver.finished and not coord.membership.busy and not coord.interrupted
    assert ranks.done == epochs and all(coord.records[m].converged for m in epochs)
    assert [coord.records[m].epochs for m in epochs] == list(epochs.values())
    checkpointed = {c.model for c, _ in ranks.sent if isinstance(c, CheckpointModel)}
    starts = [c.model for c, rank in ranks.sent if isinstance(c, StartMember) and rank == c.ranks[0]]
    assert checkpointed and ledger.round >= 2
    assert all(starts.count(m) == 1 for m in epochs if m not in checkpointed)
    assert all(starts.count(m) >= 2 for m in checkpointed)  # each went on in a later round
    logged = [e["event"] for e in events(tmp_path)]
    assert logged.count("round_start") == ledger.round + 1 and logged.count("converged") == len(epochs)


def test_the_checkpoint_signal_checkpoints_every_running_model_and_ends_the_run(tmp_path):
    import threading

    epochs = dict(zip("abcd", (5, 5, 5, 5)))
    rates = {m: 100.0 for m in epochs}
    ranks = FakeRanks(epochs, rates)
    ledger = Ledger(profile(rates, 1000, 4), [5.0] * 4, 4, 4)
    signal = threading.Event()
    signal.set()
    coord = coordinator(tmp_path, spec_of(epochs, gpus=4), ranks, ledger, "fleet-adaptive", signal=signal)
    coord.run()
    assert coord.interrupted and coord.driver.finished and not coord.membership.busy
    checkpointed = sorted(c.model for c, _ in ranks.sent if isinstance(c, CheckpointModel))
    assert checkpointed == sorted(epochs) and not any(r.converged for r in coord.records.values())


@pytest.fixture(scope="module")
def two_partitions(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("parts")
    make_synthetic(root / "all.h5", "hdf5", classes=4, samples=203, image_size=8, channels=3, seed=0, shards=1,
                   progress=False, force=False)
    partition_dataset(root / "all.h5", 2, root / "parts", seed=0, progress=False)
    return root / "parts"


def hopping_coordinator(tmp_path: Path, parts: Path, ranks: FakeRanks, policy: str) -> Coordinator:
    """A coordinator of `ranks`' models over the two partitions `parts` on two nodes of one GPU."""
    data = {"source": "hdf5", "path": str(parts), "partitioned": True}
    spec = parse_spec({"name": "c", "data": data, "seed": 1,
                       "models": [{"family": "mlp", "name": m} for m in ranks.epochs],
                       "cluster": {"nodes": 2, "gpus_per_node": 1, "preprocessors_per_node": 1},
                       "runtime": {"timeout_s": 20}, "scheduler": {"policy": policy}})
    topology = assign_roles([0, 0, 1, 1], spec.cluster)
    ctx = RunContext(spec, world=None, ctrl=ranks, data_parent=None, group_parent=None, topology=topology,
                     who=RankIdentity(0), device="cpu", run_dir=str(tmp_path))
    ledger = Ledger(profile(ranks.rates, int(ctx.partitions.samples), 1),
                    [float(e) for e in ranks.epochs.values()], 2, 1, partitions=ctx.partitions)
    records = {m.id: ModelRecord(family=m.family) for m in spec.models}
    return Coordinator(ctx, create_policy(policy, seed=0), ledger, records, EventLog(tmp_path / "events.jsonl"),
                       Console(quiet=True))


@pytest.mark.parametrize("policy", ["mop", "fleet-hop"])
def test_visits_of_partitioned_data_follow_cerebros_rules(tmp_path, two_partitions, policy):
    """Two partitions on two nodes of one GPU: each model visits each partition once per
    epoch (the fake ranks fail on a second visit), hops between them with a checkpoint, and
    trains exactly its epochs; the visit log has every visit."""
    epochs = dict(zip("abc", (2, 1, 3)))
    ranks = FakeRanks(epochs, {m: 100.0 for m in epochs}, partitions=2)
    coord = hopping_coordinator(tmp_path, two_partitions, ranks, policy)
    coord.run()
    assert ranks.done == epochs and all(coord.records[m].converged for m in epochs)
    visits = read_visits(tmp_path)
    for model, count in epochs.items():
        mine = [v for v in visits if v["model"] == model]
        assert sorted((v["epoch"], v["partition"]) for v in mine) == [(e, p) for e in range(1, count + 1)
                                                                      for p in (0, 1)]
    hops = sum(1 for c, _ in ranks.sent if isinstance(c, StartMember))
    assert hops == 2 * sum(epochs.values())


class Killed(Exception):
    """The job was killed (the fake ranks' leave report that would have come next)."""


@dataclass
class KilledWhileHopping(FakeRanks):
    """The job is killed at the first hop of a visit that does not end its epoch, after the
    group said the visit ended and while it saves the hop's checkpoint: its leave report,
    which comes after that save, never comes."""

    def improbe(self, tag: int) -> _Message | None:
        message = super().improbe(tag)
        report = message.report if message is not None else None
        if isinstance(report, MemberLeft) and report.visited is not None and report.epoch_samples:
            raise Killed(report)
        return message


@pytest.mark.parametrize("policy", ["mop", "fleet-hop"])
def test_a_visit_is_not_logged_before_the_checkpoint_that_records_it(tmp_path, two_partitions, policy):
    """A kill between a visit's end (`VisitEnded`) and its hop's checkpoint leaves the model at
    its previous checkpoint, which does not hold the visit: the resumed model visits that
    partition again, so the log has no line for it (or the epoch would list it twice)."""
    epochs = dict(zip("abc", (2, 1, 3)))
    ranks = KilledWhileHopping(epochs, {m: 100.0 for m in epochs}, partitions=2)
    coord = hopping_coordinator(tmp_path, two_partitions, ranks, policy)
    with pytest.raises(Killed) as killed:
        coord.run()
    hop = killed.value.args[0]
    assert hop.visited in coord.ledger.model(hop.model).visited  # the driver heard the visit end
    assert read_visits(tmp_path) == []  # no hop's checkpoint was committed yet: no line


def test_policy_auto_hands_over_in_the_coordinator_as_the_simulator_predicts(tmp_path):
    """The switch case of `switch_case`: planned on the wrong profile, fleet-l; the ranks report
    the true rates; at the first convergence the coordinator's driver hands the run to the
    policy the simulator predicted for the same case."""
    n = 1438
    planned = RateTable.from_dict(switch_case.profile(switch_case.PLANNED, n))
    truth = RateTable.from_dict(switch_case.profile(switch_case.TRUE, n))
    epochs = dict(switch_case.EPOCHS)
    ranks = FakeRanks(epochs, dict(zip(epochs, map(float, switch_case.TRUE))))
    ledger = Ledger(planned, [float(e) for e in epochs.values()], 4, 4)
    named = partial(create_policy, seed=0)
    rule = partial(_reconsider, named=named)
    coord = coordinator(tmp_path, spec_of(epochs, gpus=4), ranks, ledger, "fleet-l", reconsider=rule)
    coord.run()
    scenario = Scenario(truth, tuple(epochs.values()), tuple(map(float, epochs.values())), Cluster(4, 4),
                        planning_rates=planned)
    choice, predicted = simulate_auto(named, scenario, coord.account.measured_overheads())
    assert choice.name == "fleet-l" and predicted.switches
    assert [(s.current, s.to) for s in coord.switches] == [(s.current, s.to) for s in predicted.switches]
    assert ranks.done == epochs and coord.driver.name == predicted.policy


def _reconsider(current, view, costs, going_on, named):
    return reconsider(current, view, named, costs, switch_targets(named("fleet-l")), current_s=going_on)
