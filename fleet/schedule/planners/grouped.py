"""Grouped learning (issue 47, Kingpin's GROUP BY for ML): each group's configurations train on
streams of the group's own samples, each as wide as the run's end asks, started in the order
of a list schedule planned at the start (`fleet.schedule.group_plan`).

The plan, for an end ``T``:

1. Each model's *width*: the fewest GPUs on which it trains within ``T``. A model of a small
   group keeps one GPU; a model of a group too large for that trains data-parallel on more
   (the rate table's rates on those counts, over nodes where one node's GPUs are too few), so
   a large group's configurations train on several GPUs and nodes at once.
2. Each group's models become *units*, the streams it launches: with the preprocessors'
   decoding measured (``ClusterView.decode_rate``) and room in it for every group's
   rate-matched sets, models whose rates on their widths are within `TOLERANCE` of each other
   share a stream and the others get their own (the group decoded once per stream, no member
   slowed by pacing by more than that); otherwise, and where decoding was not measured, all of
   a group's models share one stream (its samples decoded once per epoch pass for all).
   With rate-matched units, a widened model may *narrow* (`fleet.schedule.group_plan.narrowed`):
   where one GPU fewer would not end by ``T`` but holds fewer GPU-seconds per sample (past a
   node's GPUs most), it starts on the wider count and, at the epoch's end the plan names, is
   checkpointed (`on_epoch`) and queued first on the narrower count (`on_checkpointed`), a unit
   of its own; only where that saves more than twice the GPU-seconds its checkpoint and restore
   (`COSTS`) hold.
3. The units, the longest first, are laid out as a list schedule on the GPUs (`scheduled`):
   each starts when enough GPUs have come free (a small group's, for all its members where
   that is soon: `together`), and one that would end after ``T`` (or after the units laid out
   before it) is widened, within a node, until it does not, if it trains `WIDE` of ``T`` or
   longer (a short one ends late by little, and widening it would rest on the rate table's
   multi-GPU rates, which estimated rates on CPU slots overstate).

``T`` starts at the earliest end at which the models' widths (and narrowing) hold no more
GPU-time than the job has (`planned_end`: from the grouped lower bound on, widening past a node
costing GPU-time), and the plan kept is the one whose list schedule ends first among ``T`` and ends up to 30 %
later (`LATER`).

Whenever GPUs come free, the units start in the plan's order while the first one fits the free
GPUs (a unit waits for its GPUs rather than let later units take them, as its schedule
assumed). A small group's unit (`JOIN_AHEAD`) waits for GPUs for all its members where they
are predicted free within `JOIN_WAIT` of its run (from the ends predicted at each start: a
member that joined its stream later would have the group decoded again); otherwise, and for a
larger group's unit, its members start as their GPUs come free, each joining the stream of
those before it. A unit starts on one node where its GPUs fit in one, preferring the nodes that
already train its group and then the node with the fewest free GPUs that fit (whole free nodes
stay free for wide units), else over several nodes (Alg. 3/4). A model that comes back to wait
(checkpointed, promoted at a rung) is queued at the end as a unit of its own.

On whole data a large group's configurations train data-parallel (a hopping configuration
trains on one GPU at a time, so a group whose longest configuration outlasts the bound on one
GPU could not meet it by hopping). On data partitioned by its groups (``fleet data partition
--group-by``: small groups whole on one part, large ones sharded over consecutive parts), the
models train by visits of their group's parts instead (`_group_visits`: Kingpin's GAP, each
configuration of a sharded group hopping from shard to shard), planned as GPUs come free.
"""

from __future__ import annotations

import math
from dataclasses import replace

from fleet.schedule._base import (NO_DECISION, CheckpointCompleted, ClusterView, Decision, EpochCompleted, Member,
                                  ModelPromoted, ModelState, StreamPlan)
from fleet.schedule.costs import Overheads
from fleet.schedule.group_plan import (Held, Narrowing, Unit, decode_per_gpu, fastest_count, group_units,
                                       head_start, held_narrowing, held_on_width, narrowed, planned_end, rest,
                                       scheduled, together, widened, width)
from fleet.schedule.grouping import epoch_scale_of, group_bound, group_of
from fleet.schedule.placement import place
from fleet.schedule.planners._group_visits import group_visits
from fleet.schedule.planners._groups import GroupPolicy, free_by_node


class Grouped(GroupPolicy):
    """Groups' models on streams as wide as the bound asks, the longest first (see the module)."""

    name = "grouped"
    visits_groups = True
    TOLERANCE = 0.05
    """Largest share of its rate a member of a rate-matched stream may lose to pacing."""
    LATER = (0.0, 0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.07, 0.08, 0.1, 0.12, 0.14, 0.17, 0.2, 0.25, 0.3)
    """The plans tried: aiming to end when the models' widths allow (`planned_end`), and these
    shares later (a later end widens fewer models: their list schedule may end earlier, most
    where pacing in shared streams makes the units last longer than their work)."""

    WIDE = 0.1
    """A unit the list schedule would end late is widened only when it trains this share of the
    planned end or longer (see the module)."""
    JOIN_AHEAD = 3072
    """Samples a member that joins a running stream starts past the stream's position at the
    least, with the runtime's defaults (`runtime.qp_samples` 2048 decoded ahead, and the switch
    two chunks of up to 512 past that): a group of no more than twice that many samples would be
    decoded more than once per pass for a late member, so its units' members start at once
    (`together`)."""
    COSTS = Overheads()
    """The checkpoint and restore a narrowing model is planned to pause for."""

    def plan(self, view: ClusterView) -> None:
        self.narrowing: dict[str, tuple[int, int]] = {}  # a started model that narrows: (after epoch, GPUs)
        self.resizing: dict[str, int] = {}  # a narrowing model being checkpointed: the GPUs it trains on next
        self.queued: set[str] = set()
        self.queue: list[Unit] = []
        self.ends: dict[int, float] = {}  # a GPU started on -> when its model was predicted to end
        self.returned: list[str] = []  # models back to wait since the last fill
        if view.partitions is not None:  # data partitioned by its groups: visits (`_group_visits`)
            return
        models = [m for group in self.waiting.values() for m in group]
        work = [(view.rates.profile(m), self._samples(view, m)) for m in models]
        held = self._held(view) if view.decode_rate is not None else held_on_width  # narrowing: split units only
        first = planned_end(work, view.total_gpus, view.gpus_per_node, self._bound(view, models), held)
        plans = [self._schedule(view, first * (1 + later)) for later in self.LATER]
        self.target, units, _ = min(plans, key=lambda plan: (plan[2], plan[0]))
        self._enqueue(units)  # self.target: the end a model queued again is widened for

    def _schedule(self, view: ClusterView, target: float) -> tuple[float, list[Unit], float]:
        """`target`, the units of a plan that aims to end then, in the order they start, and
        when its list schedule ends (`scheduled`)."""
        split = view.decode_rate is not None
        units = self._units(view, self.waiting, split, target)
        if split and decode_per_gpu(units) * view.total_gpus > view.decode_rate:
            units = self._units(view, self.waiting, False, target)  # no room to decode groups again: share
        units.sort(key=lambda u: (-u.seconds, str(u.group), u.models))
        return (target, *scheduled(units, view.total_gpus, target,
                                   lambda u, pace: self._widen(view, u, pace) if u.seconds >= self.WIDE * target else u))

    def fill(self, view: ClusterView) -> Decision:
        if view.partitions is not None:
            self.returned = []
            plans = group_visits(view, self.waiting, self.work)
            for member in (member for plan in plans for member in plan.members):
                self.waiting[group_of(view.rates, member.model)].remove(member.model)
            return Decision.launching(plans)
        self._requeue(view)
        free = free_by_node(view)
        training = self._groups_by_node(view)
        plans = []
        while self.queue:
            unit = self.queue[0]
            left, fits = sum(len(g) for g in free.values()), 0
            while fits < len(unit.counts) and sum(unit.counts[:fits + 1]) <= left:
                fits += 1
            waits = fits < len(unit.counts) and together(unit, view.total_gpus, self._wait(view, left, unit))
            if not fits or waits:
                break  # waits: for GPUs for all its members (`together`)
            plans.append(self._start(unit, fits, free, training, view))
            if fits < len(unit.counts):
                self.queue[0] = rest(unit, fits)  # the others join its stream as their GPUs come free
                break
            self.queue.pop(0)
        return Decision.launching(plans)

    def _busy_ends(self, view: ClusterView) -> list[float]:
        """When each busy GPU's model was predicted to end (now where none was)."""
        free = set(view.free_gpus)
        return [self.ends.get(g, view.time) for g in range(view.total_gpus) if g not in free]

    def _wait(self, view: ClusterView, free: int, unit: Unit) -> float:
        """How long `unit` would wait for GPUs for all its members, `free` being free now."""
        return head_start(view.time, free, self._busy_ends(view), unit.gpus) - view.time

    @staticmethod
    def _widen(view: ClusterView, unit: Unit, pace: float) -> Unit:
        """`unit` with each member on its fewest GPUs (no fewer than its own) at `pace`, within
        one node (past its own count where that is wider)."""
        gpn = view.gpus_per_node
        profiles = [view.rates.profile(m) for m in unit.models]
        counts = tuple(widened(p, c, pace, gpn, min(view.total_gpus, max(gpn, c))) for p, c in zip(profiles, unit.counts))
        rates = tuple(p.rate(c, gpn) for p, c in zip(profiles, counts))
        return replace(unit, counts=counts, rates=rates, narrowing=None)

    def _bound(self, view: ClusterView, models: list[str]) -> float:
        """The grouped lower bound of `models`."""
        gpn, limit = view.gpus_per_node, view.total_gpus
        alone = {m: self._samples(view, m) / view.rates.profile(m).rate(1, gpn) for m in models}
        longest = 0.0
        for model in sorted(alone, key=lambda m: -alone[m]):
            if alone[model] <= longest:
                break  # no model of fewer one-GPU seconds is longer at its fastest count
            profile = view.rates.profile(model)
            longest = max(longest, self._samples(view, model) / profile.rate(fastest_count(profile, gpn, limit), gpn))
        return group_bound(list(alone.values()), view.total_gpus, longest)

    @staticmethod
    def _samples(view: ClusterView, model_id: str) -> float:
        """Epoch-equivalent samples `model_id` has left (at least a tenth of an epoch)."""
        model = view.model(model_id)
        return max(model.epochs_estimate - model.epochs_done, 0.1) * view.rates.samples_per_epoch

    def _units(self, view: ClusterView, waiting: dict, split: bool, target: float) -> list[Unit]:
        """Each group's `waiting` models as units, each model on its width for `target`
        (rate-matched sets where `split`, a narrowing model a unit of its own where decoding was
        measured; else one shared unit per group)."""
        gpn, limit = view.gpus_per_node, view.total_gpus
        units = []
        for group, models in waiting.items():
            if not models:
                continue
            profiles = [view.rates.profile(m) for m in models]
            samples = [self._samples(view, m) for m in models]
            if split and view.decode_rate is not None:
                counts, narrowings = zip(*(self._narrowed(view, m, s, target) for m, s in zip(models, samples)))
            else:
                counts, narrowings = [width(p, s, target, gpn, limit) for p, s in zip(profiles, samples)], ()
            rates = [p.rate(c, gpn) for p, c in zip(profiles, counts)]
            scale = epoch_scale_of(profiles[0])
            small = view.rates.samples_per_epoch / scale <= 2 * self.JOIN_AHEAD  # its samples, decoded
            units += group_units(group, models, counts, samples, rates, scale, self.TOLERANCE if split else None,
                                 narrowings, together=small)
        return units

    def _narrowed(self, view: ClusterView, model_id: str, samples: float, end: float) -> tuple[int, Narrowing | None]:
        """`narrowed` for `model_id`: its samples left to train by `end`, narrowing at an epoch's
        end after a checkpoint and restore (`COSTS`)."""
        profile, done = view.rates.profile(model_id), view.model(model_id).epochs_done
        epoch = view.rates.samples_per_epoch

        def boundary(trained: float) -> float:
            return (math.ceil(done + trained / epoch - 1e-9) - done) * epoch

        pause = self.COSTS.checkpoint_s(profile.param_bytes) + self.COSTS.restore_s(profile.param_bytes)
        return narrowed(profile, samples, end, view.gpus_per_node, view.total_gpus, pause, boundary)

    def _held(self, view: ClusterView) -> Held:
        """`planned_end`'s GPU-seconds of a model that may narrow (`_narrowed`)."""
        def held(profile, samples: float, end: float, gpus_per_node: int, limit: int) -> float:
            count, narrowing = self._narrowed(view, profile.id, samples, end)
            return held_narrowing(samples, count, profile.rate(count, gpus_per_node), narrowing)
        return held

    def _enqueue(self, units: list[Unit]) -> None:
        """Queue `units` behind those queued, in their order."""
        for unit in units:
            self.queued.update(unit.models)
        self.queue += units

    def _requeue(self, view: ClusterView) -> None:
        """Models back to wait (checkpointed, promoted at a rung) become units of their own."""
        back = [m for m in self.returned if m not in self.queued and m in self.waiting.get(group_of(view.rates, m), ())]
        self.returned = []
        for model in dict.fromkeys(back):
            self._enqueue(self._units(view, {group_of(view.rates, model): [model]}, True, self.target))

    def on_epoch(self, event: EpochCompleted, view: ClusterView) -> Decision:
        after, _ = self.narrowing.get(event.model, (math.inf, 0))
        if event.epoch < after or view.model(event.model).state is not ModelState.RUNNING:
            return NO_DECISION
        self.resizing[event.model] = self.narrowing.pop(event.model)[1]
        return Decision(checkpoint=(event.model,))  # it narrows (`on_checkpointed`)

    def on_checkpointed(self, event: CheckpointCompleted, view: ClusterView) -> Decision:
        count = self.resizing.pop(event.model, None)
        if count is not None and view.model(event.model).state is ModelState.PAUSED:
            self._requeue_narrower(view, event.model, count)
        else:
            self.returned.append(event.model)
        return super().on_checkpointed(event, view)

    def _requeue_narrower(self, view: ClusterView, model_id: str, count: int) -> None:
        """`model_id`, checkpointed to narrow, first in the queue on `count` GPUs (most of those it
        left: it starts before any other unit takes them)."""
        profile = view.rates.profile(model_id)
        rate = profile.rate(count, view.gpus_per_node)
        self.queue.insert(0, Unit(group_of(view.rates, model_id), (model_id,), (count,),
                                  (self._samples(view, model_id),), (rate,), epoch_scale_of(profile)))
        self.queued.add(model_id)

    def on_promoted(self, event: ModelPromoted, view: ClusterView) -> Decision:
        self.returned.append(event.model)
        return super().on_promoted(event, view)

    def _start(self, unit: Unit, members: int, free: dict[int, list[int]], training: dict,
               view: ClusterView) -> StreamPlan:
        """`unit`'s first `members` models on free GPUs (see the module), joining its stream where
        models of it were launched before and it still runs; their GPUs leave `free`, their
        models the queue."""
        gpn, counts = view.gpus_per_node, unit.counts[:members]
        need = sum(counts)
        fits = [k for k, gpus in free.items() if len(gpus) >= need]
        if fits:
            home = training.get(unit.group, set())
            node = min(fits, key=lambda k: (k not in home, len(free[k]), k))
            chosen = free[node][:need]
        else:
            chosen = sorted(g for gpus in free.values() for g in gpus)
        runs = place(list(counts), chosen, gpn)
        used = {g for run in runs for g in run}
        for k in list(free):
            free[k] = [g for g in free[k] if g not in used]
            if not free[k]:
                del free[k]
        for model in unit.models[:members]:
            self.waiting[unit.group].remove(model)
            self.queued.discard(model)
        if unit.narrowing is not None:  # a unit of one model
            done = view.model(unit.models[0]).epochs_done
            after = round(done + unit.narrowing.first / view.rates.samples_per_epoch)
            self.narrowing[unit.models[0]] = (after, unit.narrowing.count)
        training.setdefault(unit.group, set()).update(g // gpn for g in used)
        for run, samples in zip(runs, unit.samples):
            self.ends.update(dict.fromkeys(run, view.time + samples / unit.pace))  # for `_wait`
        joined = next((s.id for s in view.streams if set(unit.started) & set(s.members)), None)
        return StreamPlan(tuple(Member(m, run) for m, run in zip(unit.models, runs)), join=joined)

    @staticmethod
    def _groups_by_node(view: ClusterView) -> dict[str | None, set[int]]:
        """Per group, the nodes its running models train on."""
        nodes: dict[str | None, set[int]] = {}
        for stream in view.streams:
            held = nodes.setdefault(group_of(view.rates, stream.members[0]), set())
            for model in stream.members:
                held.update(g // view.gpus_per_node for g in view.model(model).gpus)
        return nodes

