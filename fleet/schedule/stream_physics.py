"""How streams move in the simulator's virtual time: the physics of a simulated run.

Members wait for their start (planning, restore and start-up costs), a stream moves at its
slowest running member's pace (or its share of decoding), and a member leaves when it
converges, is checkpointed or ends its visit of a partition. With `Scenario.lead_samples`
(the runtime's queues: chunks decoded but not yet released by every member) a faster member
runs ahead of the slowest, at its own pace within the decoding, until it leads by that many
samples, then at the stream's pace; its trainers load their node's cores at its own pace while
it does, and decoding keeps up with the member furthest ahead. Without it (0) every member
advances by the same samples. A member joining a running stream reads from where its
preprocessors have got to (`StreamMotion.join_point`), past the chunks made for the members
before it; where those were all their stream held, it shares no decoding with them, and the
stream decodes for both (`StreamMotion.cohorts`). The simulator's run (`fleet.schedule.simulator`) owns the event loop and the
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

from fleet.schedule.decoders import assigned_shares, pick_decoders
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
        "changes", "paced", "lead_cap", "ahead", "speeds", "front", "decoders", "cohorts",
        "made_from",
    )

    def __init__(self, stream_id: int, round_index: int, partition: int | None = None,
                 own_decode_rate: float | None = None):
        self.id, self.round, self.partition = stream_id, round_index, partition
        self.own_decode_rate = own_decode_rate  # decoded by its member between steps: at this rate
        self.decoders: tuple[int, ...] = ()  # the preprocessors it takes its chunks from (); (): all of them
        # members ahead of the slowest (`Scenario.lead_samples`, set with the members: 0 is
        # lockstep): by index, their samples ahead of `pos` (at most `lead_cap`) and the speed
        # they move at while below it
        self.lead_cap = 0.0
        self.ahead: dict[int, float] = {}
        self.speeds: dict[int, float] = {}
        self.front = 0.0  # the furthest position a member reached: what was decoded
        # members (by index) that joined past every chunk of those before them, by where their
        # reading began: they share no decoding with the members before them (`join_point`)
        self.cohorts: dict[int, float] = {}
        self.made_from: tuple[float, float] | None = None  # (position, time) its decoding last began at
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
            full = self.lead_cap * (1 - 1e-9)  # within rounding of the cap: at it
            for index, speed in self.speeds.items():  # leads grow until they reach the cap
                if speed > self.pace:
                    ahead = self.ahead.get(index, 0.0) + (speed - self.pace) * dt
                    self.ahead[index] = self.lead_cap if ahead >= full else ahead
            self.front = max(self.front, self.pos + max(self.ahead.values(), default=0.0))
        self.synced_at = now

    def member_demand(self, model: ModelMotion) -> float:
        """The pace `model` allows: its rate (its steps and, for a stream its member decodes,
        its own decoding in turn)."""
        if self.own_decode_rate is None:
            return model.own_rate
        return 1 / (1 / model.own_rate + 1 / (self.own_decode_rate * self.decode_scale))

    @property
    def demand(self) -> float:
        """The pace its members allow: the slowest running member's (`member_demand`)."""
        return min(self.member_demand(m) for m in self.active.values())

    def leading(self) -> dict[int, float]:
        """Members (by index) below the lead cap, by what they would move at (their demand):
        none in lockstep."""
        if not self.lead_cap:
            return {}
        return {i: self.member_demand(m) for i, m in self.active.items() if self.ahead.get(i, 0.0) < self.lead_cap}

    @property
    def decode_demand(self) -> float:
        """What its decoding must keep up with: its fastest member below the lead cap, else its
        pace, for each cohort of members reading chunks of their own (`cohorts`)."""
        return self.decoding_speed(self.leading(), self.demand)

    def decoding_speed(self, speeds: dict[int, float], pace: float) -> float:
        """Samples/s decoded for its members moving at `speeds` (by index; the others at `pace`):
        its fastest member's, summed over the cohorts that read chunks of their own. (Each
        member is still held only to its stream's whole share of decoding, not its cohort's.)"""
        fastest: dict[float, float] = {}
        for index in self.active:
            cohort = self.cohorts.get(index, -1.0)
            fastest[cohort] = max(fastest.get(cohort, 0.0), speeds.get(index, pace))
        return sum(fastest.values())

    def join_point(self, now: float, epoch_samples: float,
                   decode_rate: float | None) -> tuple[float, float | None, bool]:
        """Where a member joining now reads its first chunk, in samples past the slowest
        member's position, the cohort it reads with (`cohorts`), and whether that cohort is
        new (begins with it).

        The runtime switches a joiner past the chunks the stream's preprocessors already made
        (`fleet.runtime.control.membership`): they decode from the stream's start, or from the
        last cohort's first chunk, at the run's `decode_rate` (None: at once), up to the lead
        ahead of the slowest member and no further than the members need. Past all the members
        need, the joiner starts a cohort of its own (it shares no decoding with them); short of
        it, it reads what the member that needs the most will read too. (0, None, False) for a
        new stream, in lockstep, or on a partition."""
        if not self.active or not self.lead_cap or self.partition is not None or self.start is None:
            return 0.0, None, False
        ends = {i: m.join_pos + m.true_epochs * epoch_samples - m.samples for i, m in self.active.items()}
        furthest = max(ends, key=ends.__getitem__)
        since_pos, since = self.made_from if self.made_from is not None else (0.0, self.start)
        made = since_pos + (now - since) * (decode_rate or math.inf) * self.decode_scale
        frontier = min(ends[furthest], made, self.pos + self.lead_cap)
        skip = max(0.0, frontier - self.pos)
        if frontier >= ends[furthest]:
            return skip, self.pos + skip, True
        return skip, self.cohorts.get(furthest), False

    def repace(self, decode_share: float = math.inf, speed_of=None, boost: float = 1.0) -> None:
        """The pace: the slowest member's demand (times `boost`, where its cores work faster
        than its rates were measured at) within `decode_share`; members below the lead cap move
        at ``speed_of(their demand)`` (default: their demand within `decode_share`)."""
        if not self.active:
            self.pace = self.slack_rate = 0.0
            self.speeds = {}
            return
        leading = self.leading()
        key = (self.changes, decode_share, boost, frozenset(leading))
        if self.paced == key:  # the same members, share and leads: the same pace
            return
        self.paced = key
        self.pace = min(self.demand * boost, decode_share)
        limit = speed_of or (lambda demand: min(demand, decode_share))
        self.speeds = {i: max(self.pace, limit(d)) for i, d in leading.items()}
        self.slack_rate = sum(len(m.gpus) * max(0.0, 1 - self.speeds.get(i, self.pace) / m.own_rate)
                              for i, m in self.active.items())

    def progress(self, model: ModelMotion) -> float:
        if model.join_pos is None:
            return model.samples
        return model.samples + self.pos - model.join_pos + self.ahead.get(model.index, 0.0)

    def level(self) -> None:
        """Keep `pos` at the slowest member (after one left): the leads' common part moves into it."""
        if self.lead_cap and self.active:
            common = min(self.ahead.get(i, 0.0) for i in self.active)
            if common > 0:
                self.pos += common
                self.ahead = {i: a - common for i, a in self.ahead.items() if i in self.active}

    def next_event_s(self, models: Sequence[ModelMotion]) -> float:
        """With leads: seconds from now to the nearest of a member's queued boundary and a lead
        reaching the cap (inf: none)."""
        soonest = min(self._filling().values(), default=math.inf)
        for entry in self._live(models):
            soonest = min(soonest, self._seconds_to(entry))
        return max(0.0, soonest)

    def take_next(self, models: Sequence[ModelMotion]) -> tuple[float, int, int, int] | None:
        """With leads, at the event `next_event_s` scheduled: the queued boundary a member
        reaches now (taken from the queue, met exactly), or None where the event was a lead
        reaching the cap (that member's lead set to it: rounding may leave it a hair below)."""
        filling = self._filling()
        live = self._live(models)
        entry = min(live, key=self._seconds_to) if live else None
        member = min(filling, key=filling.get) if filling else None
        if entry is None or (member is not None and filling[member] < self._seconds_to(entry)):
            if member is not None:
                self.ahead[member] = self.lead_cap
            return None
        self.boundaries.remove(entry)
        heapq.heapify(self.boundaries)
        index = entry[1]
        self.ahead[index] = self.ahead.get(index, 0.0) + max(0.0, self._remaining(entry))
        return entry

    def _filling(self) -> dict[int, float]:
        """Members (by index) whose lead grows, by the seconds until it reaches the cap."""
        return {i: (self.lead_cap - self.ahead.get(i, 0.0)) / (speed - self.pace)
                for i, speed in self.speeds.items() if speed > self.pace}

    def _live(self, models: Sequence[ModelMotion]) -> list[tuple[float, int, int, int]]:
        return [e for e in self.boundaries
                if e[1] in self.active and models[e[1]].generation == e[2] and models[e[1]].stream is self]

    def _remaining(self, entry: tuple[float, int, int, int]) -> float:
        return entry[0] - self.pos - self.ahead.get(entry[1], 0.0)

    def _seconds_to(self, entry: tuple[float, int, int, int]) -> float:
        """Seconds until the member of `entry` reaches it: at its speed until its lead is full,
        then at the pace."""
        remaining, index = self._remaining(entry), entry[1]
        if remaining <= 0:
            return 0.0
        speed = self.speeds.get(index, self.pace)
        if speed <= 0:
            return math.inf
        if speed > self.pace:
            filling = (self.lead_cap - self.ahead.get(index, 0.0)) / (speed - self.pace)
            if remaining <= speed * filling:
                return remaining / speed
            remaining -= speed * filling
            return filling + (remaining / self.pace if self.pace > 0 else math.inf)
        return remaining / self.pace if self.pace > 0 else math.inf

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

    def new_stream(self, stream_id: int, round_index: int, partition: int | None, own_decoding: bool = False,
                   member_gpus: Sequence[tuple[int, ...]] = (), launching: int = 1) -> StreamMotion:
        """A new stream (`member_gpus`: its members' GPUs, a master on the first of each;
        `launching`: the new streams of this decision, which share the free preprocessors)."""
        own_rate = (self.scenario.own_decode_rate or math.inf) if own_decoding else None
        stream = StreamMotion(stream_id, round_index, partition, own_rate)
        stream.synced_at = self.now
        per_node = self.scenario.preprocessors_per_node
        if per_node and not own_decoding and partition is None and self.scenario.decode_rate is not None:
            nodes_of = {p: p // per_node for p in range(per_node * self.scenario.cluster.nodes)}
            busy = [s.decoders for s in self.streams.values() if s.decoders and (s.active or s.waiting)]
            masters = {gpus[0] // self.scenario.cluster.gpus_per_node for gpus in member_gpus if gpus}
            stream.decoders = pick_decoders(nodes_of, busy, masters, launching)
        self.streams[stream.id] = stream
        return stream

    def wait(self, stream: StreamMotion, ready: list[tuple[ModelMotion, float]], when: float) -> None:
        """`ready`'s models are in `stream` and start training together at `when`."""
        if ready:
            stream.decode_scale = self.scales[ready[0][0].index]  # one group per stream
            stream.lead_cap = self.scenario.lead_samples * stream.decode_scale
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
        skip, cohort, fresh = stream.join_point(self.now, self.n, self.scenario.decode_rate)
        for index, generation in members:
            model = self.models[index]
            if model.generation != generation or model.stream is not stream:
                continue
            del stream.waiting[index]
            stream.active[index] = model
            stream.changes += 1
            stream.all_members.append(model.id)
            model.join_pos = stream.pos + skip
            if skip:
                stream.ahead[index] = skip
            if cohort is not None:
                stream.cohorts[index] = cohort
            if fresh:  # a cohort of its own: decoded from here on
                stream.made_from = (model.join_pos, self.now)
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
        factors = self._node_slowdowns(active, alone, shares)
        gpn = self.scenario.cluster.gpus_per_node
        for stream in active:
            nodes = {g // gpn for m in stream.active.values() for g in m.gpus}
            factor, share = min(factors[k] for k in nodes), shares.get(stream.id, math.inf)
            self._repace_one(stream, alone[stream.id] * factor,
                             lambda demand, share=share, factor=factor: min(demand, share) * factor, max(1.0, factor))
        if not changed.active:
            self._repace_one(changed, math.inf)

    def _decode_shares(self, active: list[StreamMotion]) -> dict[int, float]:
        """Each preprocessor-decoded stream's share of the decoding of its partition's
        preprocessors (of the run's, for whole data); none without a limit."""
        if self.scenario.decode_rate is None:
            return {}
        shares: dict[int, float] = {}
        for partition in {s.partition for s in active if s.own_decode_rate is None}:
            sharing = {s.id: s.decode_demand / s.decode_scale for s in active
                       if s.partition == partition and s.own_decode_rate is None}
            capacity = self.scenario.decode_rate / (1 if partition is None else self.partitions.count)
            if all(self.streams[i].decoders for i in sharing):  # from the preprocessors each was given
                each = capacity / (self.scenario.preprocessors_per_node * self.scenario.cluster.nodes)
                divided = assigned_shares(sharing, {i: self.streams[i].decoders for i in sharing}, each)
            else:
                divided = decode_shares(sharing, capacity)
            shares.update({i: share * self.streams[i].decode_scale for i, share in divided.items()})
        return shares

    def _node_slowdowns(self, active: list[StreamMotion], paces: dict[int, float],
                        shares: dict[int, float]) -> dict[int, float]:
        """Per node, the factor its work moves at: its machine's cores over the load of the streams
        moving at `paces` (their members below the lead cap at their own demand within the
        stream's decoding `shares`; trainers, and their stream threads' polling, where their
        members are; decoding -- at its fastest member's pace -- on its preprocessors' nodes
        (spread over all nodes where it may take any), or on the member's node for a stream it
        decodes itself; the idle preprocessors' polling; the coordinator on the first)."""
        cores, cluster = self.scenario.cores, self.scenario.cluster
        load = dict.fromkeys(range(cluster.nodes), 0.0)
        decoding_cores = dict.fromkeys(range(cluster.nodes), 0.0)
        load[0] = cores.coordinator_cores if active else 0.0
        for stream in active:
            pace = paces[stream.id]
            share = shares.get(stream.id, math.inf)
            speeds = {i: max(pace, min(d, share)) for i, d in stream.leading().items()}
            for index, model in stream.active.items():
                speed = speeds.get(index, pace)
                cost = cores.member_core_s(model.own_alone_rate, len(model.gpus))
                if stream.own_decode_rate is not None:
                    cost += cores.decode_core_s / stream.decode_scale / len(stream.active)
                polling = cores.trainer_wait_cores * model.trainer_share  # its stream thread's, all its stay
                for g in model.gpus:
                    load[g // cluster.gpus_per_node] += speed * cost * model.trainer_share / len(model.gpus) + polling
            if stream.own_decode_rate is None:
                decoding = stream.decoding_speed(speeds, pace) * cores.decode_core_s / stream.decode_scale
                per_node = self.scenario.preprocessors_per_node
                for k in ([p // per_node for p in stream.decoders] if stream.decoders else range(cluster.nodes)):
                    decoding_cores[k] += decoding / (len(stream.decoders) or cluster.nodes)
        for k in load:
            load[k] += decoding_cores[k]
            if active:  # preprocessors wait for room where decoding leaves them idle
                load[k] += cores.preprocessor_wait_cores * max(0.0, self.scenario.preprocessors_per_node - decoding_cores[k])
        return cores.node_slowdowns(load)

    def _repace_one(self, stream: StreamMotion, decode_share: float, speed_of=None, boost: float = 1.0) -> None:
        stream.sync(self.now)
        stream.repace(decode_share, speed_of, boost)
        stream.version += 1
        stream.drop_stale(self.models)
        if stream.lead_cap and stream.active:  # members ahead: the nearest boundary or full lead
            ahead = stream.next_event_s(self.models)
            if ahead < math.inf:
                self.queue.push(self.now + ahead, BOUNDARY, (stream.id, stream.version))
        elif stream.active and stream.boundaries:
            pos = stream.boundaries[0][0]
            when = self.now + max(0.0, pos - stream.pos) / stream.pace
            self.queue.push(when, BOUNDARY, (stream.id, stream.version))

    def boundary_reached(self, stream: StreamMotion) -> tuple[float, int, int, int] | None:
        """At `stream`'s ``BOUNDARY`` event: the queued boundary reached (taken from the queue;
        in lockstep the nearest, its position met), or None where a member's lead reached the cap."""
        if stream.lead_cap:
            return stream.take_next(self.models)
        reached = stream.pop_boundary()
        stream.pos = max(stream.pos, reached[0])
        return reached

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
        stream.cohorts.pop(model.index, None)
        stream.ahead.pop(model.index, None)
        stream.speeds.pop(model.index, None)
        stream.level()
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
