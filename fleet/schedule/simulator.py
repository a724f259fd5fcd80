"""Discrete-event simulator: drives any :class:`~fleet.schedule._base.Policy` on a model.

The simulator is the first of two drivers of the policy protocol (the MPI coordinator is
the second). It knows what policies must not: each model's true epochs to converge. It
turns them into the events the runtime would observe and applies each decision at once.

Model of a run
    * A stream moves at the pace of its slowest running member, ``min_i r_i(m_i)``; every
      member advances by the same number of samples. A member converges at the end of its
      ``E_i``-th epoch (``E_i * n`` samples, a partial epoch carries over a checkpoint) and
      frees its GPUs at once; the stream speeds up if it was the slowest.
    * A stream decodes each sample once for all its members: its decoded samples are the
      samples it moved while at least one member was training.
    * With a `Scenario.decode_rate` (what the run's preprocessors decode together), no stream
      moves faster than decoding: the running streams share it max-min fairly (a stream
      whose members need less than an equal share leaves the rest to the others). Without
      one, decoding keeps up, the paper's assumption.
    * A stream that decodes in its member's own trainer process (`Launch.own_decoding`,
      Baseline's) takes no share of the preprocessors: its member decodes each sample
      between its steps, at `Scenario.own_decode_rate`, so it moves at
      ``1 / (1 / r + 1 / own_decode_rate)``. Without one, its decoding is free.
    * Launching costs ``planning_s`` (fixed, or measured around the policy call); a member
      resumed from a checkpoint also waits ``restore_s``. A new stream starts when all its
      members are ready; a member joining a running stream starts when it is ready.
      Checkpointing costs ``checkpoint_s`` per model, all in parallel. GPUs are held during
      these overheads. Costs common to every policy (first model build, data loading) are
      left out.

Partitioned data (model hopping)
    With `Scenario.partition_sizes` (or a hopping policy on whole data: one partition), a
    stream trains each member for one visit of the partition its GPUs are on: its members all
    start together and leave when the stream has moved that partition's samples. Each then
    hops: a checkpoint (``checkpoint_s``, GPUs held), and a restore where it lands next
    (``restore_s``), unless that visit ended its last epoch. With a `decode_rate`, each
    partition's nodes decode their own partition at ``decode_rate / p``. The checkpoint signal
    drops the visits in flight: the models go back to their last hop.

Interrupts and resumes
    ``simulate(..., interrupt_at=t)`` does what the runtime does on the checkpoint signal:
    at ``t`` every running model is checkpointed, nothing new starts, and the run ends when
    the last checkpoint is done (``SimResult.interrupted``). :func:`resumed_scenario` then
    gives the scenario of the run started again from those checkpoints: the models not yet
    converged, each ``PAUSED`` at the (fractional) epochs it had trained, or ``PENDING``
    when it never started (``Scenario.resumed``).

Results: makespan, rounds, samples decoded, a GPU-time breakdown (useful training, pacing
slack, overheads, idle), each GPU's idle time, the planning time of every planning call,
and the full timeline of rounds, streams and members.
"""

from __future__ import annotations

import enum
import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from fleet.schedule._base import Event, ModelState, Policy, PolicyError
from fleet.schedule.costs import Overheads
from fleet.schedule.driver import Driver, Launch
from fleet.schedule.ledger import Ledger
from fleet.schedule.partitions import Partitions
from fleet.schedule.rates import RateTable

_EPS = 1e-9

# kinds of entries in the simulator's event queue (ties at one time go in this order)
_START, _CHECKPOINT_DONE, _BOUNDARY, _INTERRUPT = range(4)


def whole_epochs(epochs: Sequence[float]) -> tuple[int, ...]:
    """Estimated epochs rounded up to whole epochs (at least one): the epochs a simulated
    model really trains when the estimates are all there is."""
    return tuple(max(1, math.ceil(e - 1e-9)) for e in epochs)


def decode_shares(demands: dict[int, float], capacity: float) -> dict[int, float]:
    """Max-min fair shares of `capacity` samples/s for streams that could move at `demands`:
    a stream needing less than an equal share of what is left gets what it needs."""
    shares: dict[int, float] = {}
    left, count = capacity, len(demands)
    for stream_id, demand in sorted(demands.items(), key=lambda item: item[1]):
        shares[stream_id] = min(demand, left / count)
        left -= shares[stream_id]
        count -= 1
    return shares


@dataclass(frozen=True)
class Cluster:
    """The GPUs a run may use: GPU ``g`` is on node ``g // gpus_per_node``."""

    total_gpus: int
    gpus_per_node: int

    @property
    def nodes(self) -> int:
        """Number of nodes (the last one may be partly used)."""
        return math.ceil(self.total_gpus / self.gpus_per_node)


@dataclass(frozen=True)
class Scenario:
    """Everything about a run except the policy and the overhead model.

    Attributes:
        rates: profiled rates (taken as the truth by the simulator, shown to the policy).
        true_epochs: epochs each model really needs; only the simulator sees them.
        epochs_estimate: what the policy is told instead.
        cluster: the GPUs.
        planning_rates: rates shown to the policy when they differ from the truth (the same
            models in the same order); None: the policy sees `rates`.
        decode_rate: samples/s all the run's preprocessors decode together, shared by the
            running streams; None: decoding keeps up with every stream.
        own_decode_rate: samples/s one trainer process decodes, for the streams decoded in
            their member's own process (their steps wait for it); None: free.
        resumed: for a run resumed from checkpoints, per model the epochs it had trained
            (fractional: a partial epoch carries over; the model starts ``PAUSED``), or None
            for one that never started (``PENDING``); empty: a fresh run.
        curves: per model, the validation metric (lower is better) after each of its epochs,
            at least ``true_epochs`` of them, reported with every epoch (the stop-rule noise
            model); empty: epochs report no metric.
        partition_sizes: training samples of each partition of partitioned data (they add up
            to the rate table's ``samples_per_epoch``); empty: whole data.
        visited: for a resumed run of partitioned data, per model the partitions visited in
            its current epoch; empty: none.
    """

    rates: RateTable
    true_epochs: tuple[int, ...]
    epochs_estimate: tuple[float, ...]
    cluster: Cluster
    planning_rates: RateTable | None = None
    decode_rate: float | None = None
    own_decode_rate: float | None = None
    resumed: tuple[float | None, ...] = ()
    curves: tuple[tuple[float, ...], ...] = ()
    partition_sizes: tuple[float, ...] = ()
    visited: tuple[tuple[int, ...], ...] = ()

    def __post_init__(self) -> None:
        n = len(self.rates.models)
        if self.partition_sizes and abs(sum(self.partition_sizes) - self.rates.samples_per_epoch) > 1e-6 * max(
                1.0, self.rates.samples_per_epoch):
            raise ValueError("partition_sizes must add up to the rate table's samples_per_epoch")
        if self.visited and len(self.visited) != n:
            raise ValueError("visited needs one entry per model (or none)")
        if self.planning_rates is not None and self.planning_rates.ids != self.rates.ids:
            raise ValueError("planning_rates must hold the same models as rates, in the same order")
        if len(self.true_epochs) != n or len(self.epochs_estimate) != n:
            raise ValueError("true_epochs and epochs_estimate need one entry per model")
        if any(e < 1 for e in self.true_epochs):
            raise ValueError("every model needs at least one epoch")
        for name in ("decode_rate", "own_decode_rate"):
            if getattr(self, name) is not None and not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive (or None)")
        if self.resumed and len(self.resumed) != n:
            raise ValueError("resumed needs one entry per model (or none)")
        if self.curves and (len(self.curves) != n or any(len(c) < e for c, e in zip(self.curves, self.true_epochs))):
            raise ValueError("curves needs one entry per model, each at least as long as its true epochs")
        for done, epochs in zip(self.resumed, self.true_epochs):
            if done is not None and not 0 <= done < epochs:
                raise ValueError(f"a resumed model must have trained 0 to fewer than its {epochs} epochs, not {done}")


class Outcome(enum.Enum):
    """How a member left its stream."""

    CONVERGED = "converged"
    CHECKPOINTED = "checkpointed"
    HOPPED = "hopped"  # a visit of partitioned data ended and the model left for the next


@dataclass(frozen=True)
class MemberRecord:
    """One stay of a model on its GPUs.

    Attributes:
        model: model id.
        stream: stream id.
        round: round index.
        gpus: global GPU indices.
        launched: when the GPUs were reserved.
        start: when it began training (after planning and restore).
        end: when it converged or stopped for a checkpoint.
        released: when the GPUs were freed (``end``, or the end of the checkpoint).
        outcome: :class:`Outcome`.
        epochs_start: epochs done at ``start`` (fractional).
        epochs_end: epochs done at ``end`` (fractional).
    """

    model: str
    stream: int
    round: int
    gpus: tuple[int, ...]
    launched: float
    start: float
    end: float
    released: float
    outcome: Outcome
    epochs_start: float
    epochs_end: float


@dataclass(frozen=True)
class StreamRecord:
    """One shared stream: its members over its life and what it decoded."""

    id: int
    round: int
    start: float
    end: float
    members: tuple[str, ...]
    samples_decoded: float


@dataclass(frozen=True)
class RoundRecord:
    """A round: from its first launch to its last release of GPUs."""

    index: int
    start: float
    end: float


@dataclass(frozen=True)
class Timeline:
    """Everything that happened, in start order."""

    rounds: tuple[RoundRecord, ...]
    streams: tuple[StreamRecord, ...]
    members: tuple[MemberRecord, ...]


@dataclass(frozen=True)
class GpuTime:
    """GPU-seconds of a run by what the GPUs did; they add up to ``M * makespan``.

    Attributes:
        training: training at the model's own rate.
        pacing: held by a member but slowed down to the stream's slower pace.
        overhead: planning, restoring and checkpointing.
        idle: held by no model.
    """

    training: float
    pacing: float
    overhead: float
    idle: float


@dataclass(frozen=True)
class SimResult:
    """Outcome of one simulated run.

    Attributes:
        policy: policy name.
        total_gpus: ``M``.
        makespan: seconds until the last model converged.
        rounds: number of rounds.
        samples_decoded: samples decoded by all streams together.
        gpu_time: :class:`GpuTime` breakdown.
        idle_per_gpu: seconds each GPU held no model.
        planning_s: duration of each policy call that launched something.
        checkpoints: number of model checkpoints taken (hops included).
        timeline: the :class:`Timeline`.
        interrupted: the run was stopped by ``interrupt_at`` before every model converged.
        epochs_trained: per model, the (fractional) epochs it had trained at the end, those
            of the scenario's ``resumed`` included.
        hops: visits of partitioned data that ended with a hop (a checkpoint and, later, a
            restore on the next partition's nodes).
        visited: per model, the partitions visited in its current epoch at the end (an
            interrupted run of partitioned data); empty without partitions.
    """

    policy: str
    total_gpus: int
    makespan: float
    rounds: int
    samples_decoded: float
    gpu_time: GpuTime
    idle_per_gpu: tuple[float, ...]
    planning_s: tuple[float, ...]
    checkpoints: int
    timeline: Timeline
    interrupted: bool = False
    epochs_trained: tuple[float, ...] = ()
    hops: int = 0
    visited: tuple[tuple[int, ...], ...] = ()

    @property
    def mean_gpu_wait(self) -> float:
        """Mean idle seconds per GPU."""
        return float(np.mean(self.idle_per_gpu)) if self.idle_per_gpu else 0.0


def simulate(
    policy: Policy, scenario: Scenario, overheads: Overheads = Overheads(), interrupt_at: float | None = None
) -> SimResult:
    """Run ``policy`` on ``scenario`` until every model converged, or until the run stopped
    by the checkpoint signal at ``interrupt_at`` has checkpointed its running models.

    Raises:
        PolicyError: when the policy breaks the protocol or stalls.
    """
    return _Run(policy, scenario, overheads, interrupt_at).run()


def resumed_scenario(scenario: Scenario, result: SimResult) -> Scenario | None:
    """The scenario of a run started again from the checkpoints an interrupted run left:
    its models not yet converged, with the epochs they trained. None when all converged."""
    keep = [i for i, done in enumerate(result.epochs_trained) if done < scenario.true_epochs[i] - _EPS]
    if not keep:
        return None

    def subset(table: RateTable | None) -> RateTable | None:
        if table is None:
            return None
        return table.subset([table.models[i].id for i in keep])

    before = scenario.resumed or (None,) * len(scenario.true_epochs)
    launched = {r.model for r in result.timeline.members}
    ids = scenario.rates.ids
    resumed = tuple(result.epochs_trained[i] if before[i] is not None or ids[i] in launched else None for i in keep)
    return replace(
        scenario, rates=subset(scenario.rates), planning_rates=subset(scenario.planning_rates),
        true_epochs=tuple(scenario.true_epochs[i] for i in keep),
        epochs_estimate=tuple(scenario.epochs_estimate[i] for i in keep), resumed=resumed,
        curves=tuple(scenario.curves[i] for i in keep) if scenario.curves else (),
        visited=tuple(result.visited[i] for i in keep) if result.visited else (),
    )


# ----------------------------------------------------------------- internal state


class _Model:
    """Mutable per-model state of one run."""

    __slots__ = (
        "index", "id", "state", "true_epochs", "epochs_done", "samples", "gpus", "stream",
        "own_rate", "generation", "join_pos", "launched", "start", "epochs_start", "param_bytes", "visited",
        "visit_start",
    )

    def __init__(self, index: int, model_id: str, true_epochs: int, param_bytes: int | None):
        self.index, self.id, self.true_epochs = index, model_id, true_epochs
        self.state = ModelState.PENDING
        self.epochs_done = 0
        self.samples = 0.0  # progress in samples when it last left or joined a stream
        self.gpus: tuple[int, ...] = ()
        self.stream: _Stream | None = None
        self.own_rate = 0.0
        self.generation = 0
        self.join_pos: float | None = None  # stream position when it began consuming
        self.launched = self.start = 0.0
        self.epochs_start = 0.0
        self.param_bytes = param_bytes
        self.visited: set[int] = set()  # partitions visited in the current epoch
        self.visit_start = 0.0  # `samples` when its visit in flight began


class _Stream:
    """Mutable state of one stream; its position is advanced lazily by :meth:`sync`."""

    __slots__ = (
        "id", "round", "active", "waiting", "pos", "pace", "slack_rate", "slack", "synced_at",
        "boundaries", "version", "start", "end", "all_members", "partition", "own_decode_rate",
    )

    def __init__(self, stream_id: int, round_index: int, partition: int | None = None,
                 own_decode_rate: float | None = None):
        self.id, self.round, self.partition = stream_id, round_index, partition
        self.own_decode_rate = own_decode_rate  # decoded by its member between steps: at this rate
        self.active: dict[int, _Model] = {}
        self.waiting: dict[int, _Model] = {}
        self.pos = 0.0
        self.pace = 0.0
        self.slack_rate = 0.0
        self.slack = 0.0
        self.synced_at = 0.0
        self.boundaries: list[tuple[float, int, int, int]] = []  # (pos, model, generation, epoch)
        self.version = 0
        self.start: float | None = None
        self.end = 0.0
        self.all_members: list[str] = []

    def sync(self, now: float) -> None:
        dt = now - self.synced_at
        if self.active and dt > 0:
            self.pos += self.pace * dt
            self.slack += self.slack_rate * dt
        self.synced_at = now

    @property
    def demand(self) -> float:
        """The pace its members allow: the slowest running member's rate (its steps and
        its own decoding in turn, for a stream its member decodes)."""
        slowest = min(m.own_rate for m in self.active.values())
        return slowest if self.own_decode_rate is None else 1 / (1 / slowest + 1 / self.own_decode_rate)

    def repace(self, decode_share: float = math.inf) -> None:
        if not self.active:
            self.pace = self.slack_rate = 0.0
            return
        self.pace = min(self.demand, decode_share)
        self.slack_rate = sum(len(m.gpus) * (1 - self.pace / m.own_rate) for m in self.active.values())

    def progress(self, model: _Model) -> float:
        return model.samples + (self.pos - model.join_pos if model.join_pos is not None else 0.0)

    def push_boundary(self, model: _Model, epoch_samples: float) -> None:
        """Queue where `model`'s next epoch ends, in this stream's positions."""
        target = (model.epochs_done + 1) * epoch_samples
        pos = model.join_pos + target - model.samples
        heapq.heappush(self.boundaries, (pos, model.index, model.generation, model.epochs_done + 1))

    def push_visit_end(self, model: _Model, partition_samples: float) -> None:
        """Queue where `model`'s visit of this stream's partition ends."""
        heapq.heappush(self.boundaries, (model.join_pos + partition_samples, model.index, model.generation, -1))

    def drop_stale(self, models: Sequence[_Model]) -> None:
        """Drop queued boundaries of members that left (or came back as another generation)."""
        while self.boundaries:
            _, index, generation, _ = self.boundaries[0]
            model = models[index]
            if model.generation == generation and model.stream is self and index in self.active:
                return
            heapq.heappop(self.boundaries)


class _StreamPhysics:
    """How streams move in virtual time: members wait for their start, streams move at their
    slowest member's pace (or their share of decoding), members leave. A base of `_Run`, which
    sets the state these methods use (`clock`, `queue`, `streams`, `models`, the records)."""

    def _push(self, when: float, kind: int, payload: tuple) -> None:
        self.seq += 1
        heapq.heappush(self.queue, (when, kind, self.seq, payload))

    def _new_stream(self, stream_id: int, partition: int | None, own_decoding: bool = False) -> _Stream:
        own_rate = (self.scenario.own_decode_rate or math.inf) if own_decoding else None
        stream = _Stream(stream_id, self.driver.ledger.round, partition, own_rate)
        stream.synced_at = self.clock
        self.streams[stream.id] = stream
        return stream

    def _wait(self, stream: _Stream, ready: list[tuple[_Model, float]], when: float) -> None:
        for model, _ in ready:
            model.stream = stream
            stream.waiting[model.index] = model
        self._push(when, _START, (stream.id, tuple((m.index, m.generation) for m, _ in ready)))

    def _start_members(self, stream_id: int, members: tuple[tuple[int, int], ...]) -> None:
        stream = self.streams.get(stream_id)
        if stream is None:
            return
        stream.sync(self.clock)
        for index, generation in members:
            model = self.models[index]
            if model.generation != generation or model.state is not ModelState.RUNNING:
                continue
            del stream.waiting[index]
            stream.active[index] = model
            stream.all_members.append(model.id)
            model.join_pos = stream.pos
            model.start = self.clock
            model.epochs_start = model.samples / self.n
            if stream.partition is None:
                stream.push_boundary(model, self.n)
            else:
                stream.push_visit_end(model, self.partitions.sizes[stream.partition])
        if stream.start is None and stream.active:
            stream.start = self.clock
        self._repace(stream)

    def _repace(self, stream: _Stream) -> None:
        """New pace for `stream` after a change; with a decode limit, for every running stream
        (their shares of decoding move together)."""
        if self.scenario.decode_rate is None or stream.own_decode_rate is not None:
            self._repace_one(stream, math.inf)
            return
        sharing = [s for s in self.streams.values()
                   if s.active and s.partition == stream.partition and s.own_decode_rate is None]
        capacity = self.scenario.decode_rate / (1 if stream.partition is None else self.partitions.count)
        shares = decode_shares({s.id: s.demand for s in sharing}, capacity)
        self._repace_one(stream, shares.get(stream.id, math.inf))
        for other in sharing:
            if other is not stream:
                self._repace_one(other, shares[other.id])

    def _repace_one(self, stream: _Stream, decode_share: float) -> None:
        stream.sync(self.clock)
        stream.repace(decode_share)
        stream.version += 1
        stream.drop_stale(self.models)
        if stream.active and stream.boundaries:
            pos = stream.boundaries[0][0]
            when = self.clock + max(0.0, pos - stream.pos) / stream.pace
            self._push(when, _BOUNDARY, (stream.id, stream.version))

    def _leave(self, stream: _Stream, model: _Model, outcome: Outcome, released: float) -> None:
        stream.sync(self.clock)
        progress = stream.progress(model)
        if outcome is Outcome.CONVERGED:
            progress = model.true_epochs * self.n
        self.members.append(
            MemberRecord(
                model.id, stream.id, stream.round, model.gpus, model.launched, model.start,
                self.clock, released, outcome, model.epochs_start, progress / self.n,
            )
        )
        model.samples = progress
        model.join_pos = None
        del stream.active[model.index]
        self._repace(stream)
        self._close_if_empty(stream)

    def _close_if_empty(self, stream: _Stream) -> None:
        if stream.active or stream.waiting:
            return
        stream.end = self.clock
        self.finished_streams.append(self.streams.pop(stream.id))

    def _release(self, model: _Model) -> None:
        model.gpus = ()
        model.stream = None
        self.last_release = self.clock


class _Run(_StreamPhysics):
    """One simulated run: the `World` its `Driver` runs the policy in; :meth:`run` is the
    event loop. It supplies virtual time and the physics of streams; the driver does the rest."""

    def __init__(self, policy: Policy, scenario: Scenario, overheads: Overheads, interrupt_at: float | None = None):
        self.scenario, self.costs, self.interrupt_at = scenario, overheads, interrupt_at
        self.cluster = scenario.cluster
        self.n = scenario.rates.samples_per_epoch
        self.rate_matrix = scenario.rates.matrix(self.cluster.total_gpus)
        self.models = [
            _Model(i, p.id, e, p.param_bytes)
            for i, (p, e) in enumerate(zip(scenario.rates.models, scenario.true_epochs))
        ]
        for model, done in zip(self.models, scenario.resumed):
            if done is not None:
                model.state, model.samples, model.epochs_done = ModelState.PAUSED, done * self.n, int(done + _EPS)
        shown = scenario.rates if scenario.planning_rates is None else scenario.planning_rates
        ledger = Ledger(
            shown, scenario.epochs_estimate, self.cluster.total_gpus, self.cluster.gpus_per_node,
            epochs_done={m.id: m.epochs_done for m in self.models},
            paused=[m.id for m in self.models if m.state is ModelState.PAUSED], decode_rate=scenario.decode_rate,
            partitions=self._partitions(scenario), visited=dict(zip(shown.ids, scenario.visited)),
        )
        for model, seen in zip(self.models, scenario.visited):
            model.visited = set(seen)
        self.driver = Driver(policy, ledger, self)
        self.partitions = ledger.partitions  # the driver gives a hopping policy one on whole data
        self.clock = 0.0
        self.round_start = 0.0
        self.queue: list[tuple] = []  # (time, kind, seq, payload)
        self.seq = 0
        self.streams: dict[int, _Stream] = {}
        self.finished_streams: list[_Stream] = []
        self.members: list[MemberRecord] = []
        self.rounds: list[RoundRecord] = []
        self.planning: list[float] = []
        self.checkpoints = 0
        self.converged = 0
        self.last_release = 0.0
        self.hops = 0

    def _partitions(self, scenario: Scenario) -> Partitions | None:
        if not scenario.partition_sizes:
            return None
        return Partitions(tuple(scenario.partition_sizes), self.cluster.gpus_per_node, self.cluster.nodes)

    # -- the loop --------------------------------------------------------------------

    def run(self) -> SimResult:
        if self.interrupt_at is not None:
            self._push(self.interrupt_at, _INTERRUPT, ())
        self.driver.start()
        while self.converged < len(self.models):
            if self.driver.interrupted and self.driver.ledger.drained:
                break  # every checkpoint the signal asked for is done
            if not self.queue:
                raise PolicyError(f"{self.driver.name}: stalled with {len(self.models) - self.converged} models left")
            when, kind, _, payload = heapq.heappop(self.queue)
            self.clock = max(self.clock, when)
            self._dispatch(kind, payload)
            if self.checkpoints - self.hops > 100 * len(self.models):  # hops are the plan, not churn
                raise PolicyError(f"{self.driver.name}: more than {100 * len(self.models)} checkpoints")
        return _summarize(self)

    def _dispatch(self, kind: int, payload: tuple) -> None:
        if kind == _START:
            self._start_members(*payload)
        elif kind == _CHECKPOINT_DONE:
            self._finish_checkpoint(*payload)
        elif kind == _BOUNDARY:
            self._stream_boundary(*payload)
        else:
            self.driver.interrupt()

    # -- the World the driver calls ------------------------------------------------------

    def now(self) -> float:
        return self.clock

    def before_policy(self, event: Event) -> None:
        pass

    def round_ending(self, index: int) -> None:
        pass

    def checkpoint(self, model_id: str) -> None:
        model = self._model(model_id)
        done = self.clock + self.costs.checkpoint_s(model.param_bytes)
        stream = model.stream
        stream.sync(self.clock)
        if model.index in stream.active and stream.progress(model) >= (model.true_epochs - _EPS) * self.n:
            self._converge(stream, model)  # its last epoch ended at this instant
            return
        if model.index in stream.active:
            self._leave(stream, model, Outcome.CHECKPOINTED, released=done)
        else:  # still waiting to start: nothing trained, but the GPUs were held
            self.members.append(
                MemberRecord(
                    model.id, stream.id, stream.round, model.gpus, model.launched, self.clock,
                    self.clock, done, Outcome.CHECKPOINTED, model.samples / self.n, model.samples / self.n,
                )
            )
            stream.waiting.pop(model.index, None)
            self._close_if_empty(stream)
        if stream.partition is not None:  # the checkpoint signal: the visit in flight is dropped
            model.samples = model.visit_start
        self._hop_away(model, done)

    def _hop_away(self, model: _Model, done: float) -> None:
        """The model left its stream and is checkpointed until `done`."""
        model.state = ModelState.CHECKPOINTING
        model.stream = None
        model.generation += 1
        self.checkpoints += 1
        self._push(done, _CHECKPOINT_DONE, (model.index,))

    def launch(self, launches: Sequence[Launch], new_round: bool, planning_s: float) -> None:
        if new_round:
            if self.driver.ledger.launches > 1:
                self.rounds.append(RoundRecord(self.driver.ledger.round - 1, self.round_start, self.last_release))
            self.round_start = self.clock
        self.planning.append(planning_s if self.costs.planning_s is None else self.costs.planning_s)
        delay = self.planning[-1]
        for launch in launches:
            ready = [self._reserve(member.model, member.gpus, delay) for member in launch.members]
            if not launch.join:
                stream = self._new_stream(launch.stream, launch.partition, launch.own_decoding)
                self._wait(stream, ready, max(r for _, r in ready))
            else:
                stream = self.streams[launch.stream]
                for model, when in ready:
                    self._wait(stream, [(model, when)], when)

    def _reserve(self, model_id: str, gpus: tuple[int, ...], delay: float) -> tuple[_Model, float]:
        model = self._model(model_id)
        restore = self.costs.restore_s(model.param_bytes) if model.state is ModelState.PAUSED else 0.0
        model.gpus = tuple(gpus)
        model.state = ModelState.RUNNING
        model.generation += 1
        model.launched = self.clock
        model.visit_start = model.samples
        model.own_rate = float(self.rate_matrix[model.index, len(gpus) - 1])
        return model, self.clock + delay + restore + self.costs.start_s

    # -- event handlers --------------------------------------------------------------

    def _stream_boundary(self, stream_id: int, version: int) -> None:
        stream = self.streams.get(stream_id)
        if stream is None or stream.version != version:
            return
        stream.sync(self.clock)
        pos, index, _, epoch = heapq.heappop(stream.boundaries)
        stream.pos = max(stream.pos, pos)
        model = self.models[index]
        if stream.partition is not None:
            self._visit_end(stream, model)
            return
        model.epochs_done = epoch
        if epoch >= model.true_epochs:
            self._converge(stream, model)
            return
        stream.push_boundary(model, self.n)
        self._repace(stream)
        self.driver.epoch_completed(model.id, epoch, model.own_rate, _metric(self.scenario, index, epoch))

    def _visit_end(self, stream: _Stream, model: _Model) -> None:
        """`model` passed over its stream's partition: its epoch may end; it converges or hops."""
        model.visited.add(stream.partition)
        ended = len(model.visited) == self.partitions.count
        if ended:
            model.epochs_done += 1
            model.visited.clear()
            if model.epochs_done >= model.true_epochs:
                self._converge(stream, model)
                return
        rate = model.own_rate
        done = self.clock + self.costs.checkpoint_s(model.param_bytes)
        self._leave(stream, model, Outcome.HOPPED, released=done)
        model.samples = model.visit_start + self.partitions.sizes[stream.partition]
        self._hop_away(model, done)
        self.hops += 1
        metric = _metric(self.scenario, model.index, model.epochs_done) if ended else None
        self.driver.visit_completed(model.id, stream.partition, model.epochs_done, rate, metric)

    def _converge(self, stream: _Stream, model: _Model) -> None:
        rate = model.own_rate
        model.epochs_done = model.true_epochs
        self._leave(stream, model, Outcome.CONVERGED, released=self.clock)
        model.state = ModelState.CONVERGED
        self._release(model)
        self.converged += 1
        self.driver.converged(model.id, model.epochs_done, rate)

    def _finish_checkpoint(self, index: int) -> None:
        model = self.models[index]
        model.state = ModelState.PAUSED
        self._release(model)
        self.driver.checkpointed(model.id, model.epochs_done)

    def _model(self, model_id: str) -> _Model:
        return self.models[self.driver.ledger.rates.index(model_id)]


def _metric(scenario: Scenario, index: int, epoch: int) -> float | None:
    """The validation metric model `index` reports after `epoch`, where the scenario has curves."""
    return scenario.curves[index][epoch - 1] if scenario.curves else None


def _summarize(run: _Run) -> SimResult:
    """The result of a run that ended."""
    makespan = run.clock
    run.rounds.append(RoundRecord(run.driver.ledger.round, run.round_start, makespan))
    streams = sorted(run.finished_streams + list(run.streams.values()), key=lambda s: s.id)
    records = tuple(
        StreamRecord(s.id, s.round, s.start if s.start is not None else s.end, s.end,
                     tuple(s.all_members), s.pos)
        for s in streams
    )
    members = tuple(sorted(run.members, key=lambda r: (r.launched, r.stream, r.model)))
    gpu_time, idle = _gpu_time(members, streams, run.cluster.total_gpus, makespan)
    return SimResult(
        run.driver.name, run.cluster.total_gpus, makespan, len(run.rounds),
        float(sum(s.pos for s in streams)), gpu_time, idle, tuple(run.planning),
        run.checkpoints, Timeline(tuple(run.rounds), records, members),
        run.converged < len(run.models), tuple(m.samples / run.n for m in run.models), run.hops,
        tuple(tuple(sorted(m.visited)) for m in run.models) if run.partitions is not None else (),
    )


def _gpu_time(
    members: Sequence[MemberRecord], streams: Sequence[_Stream], total_gpus: int, makespan: float
) -> tuple[GpuTime, tuple[float, ...]]:
    held = np.zeros(total_gpus)
    training = overhead = 0.0
    for r in members:
        for g in r.gpus:
            held[g] += r.released - r.launched
        training += (r.end - r.start) * len(r.gpus)
        overhead += ((r.start - r.launched) + (r.released - r.end)) * len(r.gpus)
    pacing = float(sum(s.slack for s in streams))
    idle = np.maximum(makespan - held, 0.0)
    breakdown = GpuTime(training - pacing, pacing, overhead, float(idle.sum()))
    return breakdown, tuple(float(x) for x in idle)
