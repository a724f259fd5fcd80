"""How streams move in the simulator's virtual time: the physics of a simulated run.

Members wait for their start (planning, restore and start-up costs), a stream moves at its
slowest running member's pace (or its share of decoding), every member advances by the same
samples, and a member leaves when it converges, is checkpointed or ends its visit of a
partition. The simulator's run (`fleet.schedule.simulator`) owns the event loop and the
`Driver`; it keeps the books of state, epochs and visits (the driver's `Ledger`) and asks this
module only where things are in time: each model's samples, GPUs and stream, each stream's
position and pace, and the records of who trained where.

Grouped data (`fleet.schedule.grouping`): a model of a group moves in epoch-equivalent samples
(its rates times N / n_g, its `epoch_scale_of`); a stream holds one group's models, and its
decoding (the preprocessors' share, a member's own) counts real samples: its pace over the
scale.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence

from fleet.schedule.grouping import GROUP_KEY, epoch_scale_of
from fleet.schedule.partitions import Partitions
from fleet.schedule.scenario import Scenario
from fleet.schedule.sim_records import MemberRecord, Outcome

EPS = 1e-9

# kinds of entries in the simulator's event queue (ties at one time go in this order)
START, CHECKPOINT_DONE, BOUNDARY, INTERRUPT = range(4)


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


class EventQueue:
    """Virtual time: what happens next, in time order (ties by kind, then by arrival)."""

    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple] = []  # (time, kind, seq, payload)
        self._seq = 0

    def __bool__(self) -> bool:
        return bool(self._heap)

    def push(self, when: float, kind: int, payload: tuple) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (when, kind, self._seq, payload))

    def pop(self) -> tuple[int, tuple]:
        """The next entry's kind and payload; the clock moves to its time."""
        when, kind, _, payload = heapq.heappop(self._heap)
        self.now = max(self.now, when)
        return kind, payload


class ModelMotion:
    """Where one model is in time: its progress in samples, its GPUs and stream, the times of
    its stay. Its state, epochs done and partitions visited are the ledger's."""

    __slots__ = (
        "index", "id", "true_epochs", "samples", "gpus", "stream", "own_rate", "generation", "join_pos",
        "launched", "start", "epochs_start", "param_bytes", "visit_start", "has_checkpoint", "own_alone_rate",
        "trainer_share",
    )

    def __init__(self, index: int, model_id: str, true_epochs: int, param_bytes: int | None):
        self.index, self.id, self.true_epochs = index, model_id, true_epochs
        self.samples = 0.0  # progress in samples when it last left or joined a stream
        self.gpus: tuple[int, ...] = ()
        self.stream: StreamMotion | None = None
        self.own_rate = 0.0
        self.own_alone_rate = 0.0  # the rate table's, before the trainers' overhead on shared cores
        self.trainer_share = 1.0  # the part of its trainers' work it is: 1, or 1/K for one of a bundle's K models
        self.generation = 0
        self.join_pos: float | None = None  # stream position when it began consuming
        self.launched = self.start = 0.0
        self.epochs_start = 0.0
        self.param_bytes = param_bytes
        self.visit_start = 0.0  # `samples` when its visit in flight began
        self.has_checkpoint = False  # a launch restores it first


class StreamMotion:
    """Mutable state of one stream; its position is advanced lazily by :meth:`sync`."""

    __slots__ = (
        "id", "round", "active", "waiting", "pos", "pace", "slack_rate", "slack", "synced_at",
        "boundaries", "version", "start", "end", "all_members", "partition", "own_decode_rate", "decode_scale",
        "changes", "paced",
    )

    def __init__(self, stream_id: int, round_index: int, partition: int | None = None,
                 own_decode_rate: float | None = None):
        self.id, self.round, self.partition = stream_id, round_index, partition
        self.own_decode_rate = own_decode_rate  # decoded by its member between steps: at this rate
        self.active: dict[int, ModelMotion] = {}
        self.waiting: dict[int, ModelMotion] = {}
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
        self.decode_scale = 1.0  # grouped data: epoch-equivalent samples per sample decoded (N / n_g)
        self.changes = 0  # counts the changes of `active` (a member joined or left)
        self.paced: tuple[int, float] | None = None  # (changes, decode share) `pace` was computed for

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
        if self.own_decode_rate is None:
            return slowest
        return 1 / (1 / slowest + 1 / (self.own_decode_rate * self.decode_scale))

    def repace(self, decode_share: float = math.inf) -> None:
        if not self.active:
            self.pace = self.slack_rate = 0.0
            return
        if self.paced == (self.changes, decode_share):  # the same members and share: the same pace
            return
        self.paced = (self.changes, decode_share)
        self.pace = min(self.demand, decode_share)
        self.slack_rate = sum(len(m.gpus) * (1 - self.pace / m.own_rate) for m in self.active.values())

    def progress(self, model: ModelMotion) -> float:
        return model.samples + (self.pos - model.join_pos if model.join_pos is not None else 0.0)

    def push_boundary(self, model: ModelMotion, epoch: int, epoch_samples: float) -> None:
        """Queue where `model`'s epoch number `epoch` ends, in this stream's positions."""
        pos = model.join_pos + epoch * epoch_samples - model.samples
        heapq.heappush(self.boundaries, (pos, model.index, model.generation, epoch))

    def push_visit_end(self, model: ModelMotion, partition_samples: float) -> None:
        """Queue where `model`'s visit of this stream's partition ends."""
        heapq.heappush(self.boundaries, (model.join_pos + partition_samples, model.index, model.generation, -1))

    def pop_boundary(self) -> tuple[float, int, int, int]:
        """The nearest queued boundary: (position, model index, generation, epoch or -1 for a visit's end)."""
        return heapq.heappop(self.boundaries)

    def drop_stale(self, models: Sequence[ModelMotion]) -> None:
        """Drop queued boundaries of members that left (or came back as another generation)."""
        while self.boundaries:
            _, index, generation, _ = self.boundaries[0]
            model = models[index]
            if model.generation == generation and model.stream is self and index in self.active:
                return
            heapq.heappop(self.boundaries)


class StreamPhysics:
    """The streams of one simulated run and the models in them; see the module docstring.

    Args:
        scenario: the run's scenario (its true rates and epochs, its decoding limits).
        partitions: the run's partitions of the data, or None for whole data.
        queue: the run's event queue and clock; the physics queues each stream's next
            boundary (``BOUNDARY``) and each launch's start (``START``) on it.
        epochs_done: the ledger's epochs done of a model (by id).
    """

    def __init__(self, scenario: Scenario, partitions: Partitions | None, queue: EventQueue,
                 epochs_done: Callable[[str], int]):
        self.scenario, self.partitions, self.queue, self.epochs_done = scenario, partitions, queue, epochs_done
        self.n = scenario.rates.samples_per_epoch
        self.models = [
            ModelMotion(i, p.id, e, p.param_bytes) for i, (p, e) in enumerate(zip(scenario.rates.models,
                                                                                   scenario.true_epochs))
        ]
        for model, done in zip(self.models, scenario.resumed):
            if done is not None:
                model.samples, model.has_checkpoint = done * self.n, True
        self.scales = [epoch_scale_of(p) for p in scenario.rates.models]
        self.groups = [p.extra.get(GROUP_KEY) for p in scenario.rates.models]
        self.streams: dict[int, StreamMotion] = {}
        self.finished_streams: list[StreamMotion] = []
        self.members: list[MemberRecord] = []
        self.last_release = 0.0

    @property
    def now(self) -> float:
        return self.queue.now

    def new_stream(self, stream_id: int, round_index: int, partition: int | None,
                   own_decoding: bool = False) -> StreamMotion:
        own_rate = (self.scenario.own_decode_rate or math.inf) if own_decoding else None
        stream = StreamMotion(stream_id, round_index, partition, own_rate)
        stream.synced_at = self.now
        self.streams[stream.id] = stream
        return stream

    def wait(self, stream: StreamMotion, ready: list[tuple[ModelMotion, float]], when: float) -> None:
        """`ready`'s models are in `stream` and start training together at `when`."""
        if ready:
            stream.decode_scale = self.scales[ready[0][0].index]  # one group per stream
        for model, _ in ready:
            model.stream = stream
            stream.waiting[model.index] = model
        self.queue.push(when, START, (stream.id, tuple((m.index, m.generation) for m, _ in ready)))

    def start_members(self, stream_id: int, members: tuple[tuple[int, int], ...]) -> None:
        """The members (index, generation) of a ``START`` entry begin to train, where still there."""
        stream = self.streams.get(stream_id)
        if stream is None:
            return
        stream.sync(self.now)
        for index, generation in members:
            model = self.models[index]
            if model.generation != generation or model.stream is not stream:
                continue
            del stream.waiting[index]
            stream.active[index] = model
            stream.changes += 1
            stream.all_members.append(model.id)
            model.join_pos = stream.pos
            model.start = self.now
            model.epochs_start = model.samples / self.n
            if stream.partition is None:
                stream.push_boundary(model, self.epochs_done(model.id) + 1, self.n)
            else:
                stream.push_visit_end(model, self.partitions.visit_samples(self.groups[model.index], stream.partition))
        if stream.start is None and stream.active:
            stream.start = self.now
        self.repace(stream)

    def repace(self, stream: StreamMotion) -> None:
        """New pace for `stream` after a change; with a decode limit, for every running stream
        (their shares of decoding move together), and on shared cores for every stream."""
        if self.scenario.cores is not None:
            self._repace_sharing_cores(stream)
            return
        if self.scenario.decode_rate is None or stream.own_decode_rate is not None:
            self._repace_one(stream, math.inf)
            return
        sharing = [s for s in self.streams.values()
                   if s.active and s.partition == stream.partition and s.own_decode_rate is None]
        shares = self._decode_shares(sharing)
        self._repace_one(stream, shares.get(stream.id, math.inf))
        for other in sharing:
            if other is not stream:
                self._repace_one(other, shares[other.id])

    def _repace_sharing_cores(self, changed: StreamMotion) -> None:
        """Every stream's pace on nodes whose cores its trainers and the preprocessors share
        (`fleet.schedule.cores`): each moves at what its members and its decoding share allow,
        slowed by the most loaded node it trains on."""
        active = [s for s in self.streams.values() if s.active]
        shares = self._decode_shares(active)
        alone = {s.id: min(s.demand, shares.get(s.id, math.inf)) for s in active}
        factors = self._node_slowdowns(active, alone)
        gpn = self.scenario.cluster.gpus_per_node
        for stream in active:
            nodes = {g // gpn for m in stream.active.values() for g in m.gpus}
            self._repace_one(stream, alone[stream.id] * min(factors[k] for k in nodes))
        if not changed.active:
            self._repace_one(changed, math.inf)

    def _decode_shares(self, active: list[StreamMotion]) -> dict[int, float]:
        """Each preprocessor-decoded stream's share of the decoding of its partition's
        preprocessors (of the run's, for whole data); none without a limit."""
        if self.scenario.decode_rate is None:
            return {}
        shares: dict[int, float] = {}
        for partition in {s.partition for s in active if s.own_decode_rate is None}:
            sharing = {s.id: s.demand / s.decode_scale for s in active
                       if s.partition == partition and s.own_decode_rate is None}
            capacity = self.scenario.decode_rate / (1 if partition is None else self.partitions.count)
            shares.update({i: share * self.streams[i].decode_scale
                           for i, share in decode_shares(sharing, capacity).items()})
        return shares

    def _node_slowdowns(self, active: list[StreamMotion], paces: dict[int, float]) -> dict[int, float]:
        """Per node, the factor its work moves at: its machine's cores over the load of the streams
        moving at `paces` (trainers where their members are, decoding spread over all nodes or
        on the member's node for a stream it decodes itself, the coordinator on the first)."""
        cores, cluster = self.scenario.cores, self.scenario.cluster
        load = dict.fromkeys(range(cluster.nodes), 0.0)
        load[0] = cores.coordinator_cores if active else 0.0
        for stream in active:
            pace = paces[stream.id]
            for model in stream.active.values():
                cost = cores.member_core_s(model.own_alone_rate, len(model.gpus))
                if stream.own_decode_rate is not None:
                    cost += cores.decode_core_s / stream.decode_scale / len(stream.active)
                for g in model.gpus:
                    load[g // cluster.gpus_per_node] += pace * cost * model.trainer_share / len(model.gpus)
            if stream.own_decode_rate is None:
                for k in load:
                    load[k] += pace * cores.decode_core_s / stream.decode_scale / cluster.nodes
        return cores.node_slowdowns(load)

    def _repace_one(self, stream: StreamMotion, decode_share: float) -> None:
        stream.sync(self.now)
        stream.repace(decode_share)
        stream.version += 1
        stream.drop_stale(self.models)
        if stream.active and stream.boundaries:
            pos = stream.boundaries[0][0]
            when = self.now + max(0.0, pos - stream.pos) / stream.pace
            self.queue.push(when, BOUNDARY, (stream.id, stream.version))

    def leave(self, stream: StreamMotion, model: ModelMotion, outcome: Outcome, released: float) -> None:
        """`model` stops training in `stream` now; its GPUs are held until `released`."""
        stream.sync(self.now)
        progress = stream.progress(model)
        if outcome is Outcome.CONVERGED:
            progress = model.true_epochs * self.n
        self.members.append(
            MemberRecord(
                model.id, stream.id, stream.round, model.gpus, model.launched, model.start,
                self.now, released, outcome, model.epochs_start, progress / self.n,
            )
        )
        model.samples = progress
        model.join_pos = None
        del stream.active[model.index]
        stream.changes += 1
        self.repace(stream)
        self.close_if_empty(stream)

    def close_if_empty(self, stream: StreamMotion) -> None:
        if stream.active or stream.waiting:
            return
        stream.end = self.now
        self.finished_streams.append(self.streams.pop(stream.id))

    def release(self, model: ModelMotion) -> None:
        model.gpus = ()
        model.stream = None
        self.last_release = self.now
