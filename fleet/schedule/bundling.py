"""Bundles: models of one architecture trained as one fused model on one trainer (issue 49),
planned by any policy as one unit.

Which models may fuse is the engines' question (`fleet.engines.fusion`, which this package
does not import): the runtime asks it and hands the groups here as plain ids. Here:

- `form_bundles` splits each fusable group into bundles: as many as the group's share of the
  trainer slots (its models over all the models left, times the slots), so that a sweep that
  fills a cluster keeps every slot busy, and at most `MAX_MEMBERS` models each (without a
  profile of a bundle's memory, a cap). A bundle of one is no bundle.
- `Bundled` wraps a policy that puts one-trainer members on streams (fleet-g, fleet-l,
  fleet-adaptive, homogeneous, baseline). The books (the driver's `Ledger`) stay per model:
  epochs, checkpoints, early stopping's rungs and convergence are each model's own. The
  wrapped policy sees each bundle as one model (a *unit*, id ``a+b+c``), at the bundle's rate,
  and its decisions about a unit become decisions about the unit's models: a launch starts its
  waiting models as one bundle member (`Member.models`) on the unit's one GPU, a checkpoint
  checkpoints its running models. Events become the unit's as the unit's state changes: its
  first report of each epoch; `ModelConverged` when its last model converges; when its last
  running model leaves its GPU otherwise, `CheckpointCompleted` where the policy asked for the
  checkpoint (or every model left is held at a rung), else `ModelPromoted` (it may be launched
  again: some of its models wait); `ModelPromoted` too when a model of a unit held at a rung
  is promoted. Members that converge, are stopped or held while others train leave the bundle
  and tell the policy nothing: the GPU is still the unit's.

A bundle forms only where a launch starts one (a round's or a checkpoint's boundary), and
the units are fixed for the driver's life (a policy keeps its models' ids): a model that left
its bundle (held at a rung, then promoted) waits for the unit's next launch.

A unit's rate is the bundle's on one trainer, from its models' own: each step costs the sum
of theirs (``1 / sum(1 / r_i)``), what the emulated device and a CPU measure; a GPU's fused
bundle is faster, which the profiler does not measure yet. A unit never takes more than one
trainer: its rate is known on one only, so no count beyond is faster.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from fleet.schedule._base import (
    NO_DECISION,
    CheckpointCompleted,
    ClusterView,
    Decision,
    EpochCompleted,
    Event,
    Member,
    ModelConverged,
    ModelPromoted,
    ModelState,
    ModelView,
    Policy,
    PolicyError,
    StreamPlan,
    StreamView,
)
from fleet.schedule.rates import ModelProfile, RateTable

MAX_MEMBERS = 8
"""The most models in one bundle (without a profile of a bundle's memory)."""

_WAITING = (ModelState.PENDING, ModelState.PAUSED)
_ON_GPUS = (ModelState.RUNNING, ModelState.CHECKPOINTING)


def form_bundles(groups: Sequence[Sequence[str]], models_left: int, slots: int,
                 max_members: int = MAX_MEMBERS) -> list[tuple[str, ...]]:
    """Bundles of 2 or more models from fusable `groups` (each group's models may train as one;
    give models at different positions in their epochs in different groups): each group split
    into its share of the `slots`, ``ceil(n * slots / models_left)`` bundles (at least
    ``ceil(n / max_members)``), of sizes that differ by at most one, in the group's order."""
    bundles = []
    for group in groups:
        n = len(group)
        if n < 2:
            continue
        count = min(n, max(math.ceil(n / max_members), math.ceil(n * slots / max(models_left, n))))
        base, extra = divmod(n, count)
        start = 0
        for k in range(count):
            size = base + (k < extra)
            if size > 1:
                bundles.append(tuple(group[start:start + size]))
            start += size
    return bundles


def unit_id(members: Sequence[str]) -> str:
    """The id a policy knows a bundle by (``+`` is in no model id)."""
    return "+".join(members)


def bundle_rate(rates: RateTable, members: Sequence[str]) -> float:
    """Samples/s of a bundle on one trainer when its step costs the sum of its models' steps."""
    return 1.0 / sum(1.0 / rates.rate(m, 1) for m in members)


def unit_state(states: Sequence[ModelState]) -> ModelState:
    """A unit's state from its models' (see the module docstring)."""
    for state in (ModelState.RUNNING, ModelState.CHECKPOINTING, ModelState.PAUSED, ModelState.PENDING,
                  ModelState.HELD):
        if state in states:
            return state
    return ModelState.CONVERGED


class UnitBooks:
    """The units of a run's bundles, and each unit's view built from its models' views.

    Args:
        bundles: the bundles (model ids; one of one model is no bundle and ignored).
    """

    def __init__(self, bundles: Sequence[Sequence[str]]):
        self.units = {unit_id(b): tuple(b) for b in bundles if len(b) > 1}
        self.unit_of = {m: u for u, members in self.units.items() for m in members}
        self._tables: tuple[RateTable, RateTable] | None = None  # (the models' table, the units')

    def table(self, rates: RateTable) -> RateTable:
        """The units' rate table: each unit at its first model's place, at the bundle's rate on
        one trainer; the other models as they are."""
        if self._tables is not None and self._tables[0] is rates:
            return self._tables[1]
        profiles, added = [], set()
        for profile in rates.models:
            unit = self.unit_of.get(profile.id)
            if unit is None:
                profiles.append(profile)
            elif unit not in added:
                added.add(unit)
                members = [rates.profile(m) for m in self.units[unit]]
                param_bytes = sum(p.param_bytes or 0 for p in members) or None
                profiles.append(ModelProfile(unit, (bundle_rate(rates, self.units[unit]),), None, param_bytes,
                                             profile.extra))
        table = RateTable(tuple(profiles), rates.gpus_per_node, rates.samples_per_epoch, rates.extra)
        self._tables = (rates, table)
        return table

    def unit_view(self, unit: str, view: ClusterView) -> ModelView:
        """The unit as one model: its state and GPUs from its models', its epochs those of the
        models it still trains (the most any of them did, with the most any has left)."""
        models = [view.model(m) for m in self.units[unit]]
        live = [m for m in models if m.state is not ModelState.CONVERGED] or models
        done = max(m.epochs_done for m in live)
        left = max(m.epochs_estimate - m.epochs_done for m in live)
        holding = next((m for m in models if m.state in _ON_GPUS), None)
        stops = [m.next_stop for m in live if m.next_stop is not None]
        return ModelView(unit, unit_state([m.state for m in models]), done, done + left,
                         holding.gpus if holding else (), holding.stream if holding else None,
                         next_stop=min(stops) if stops else None)

    def view(self, view: ClusterView) -> ClusterView:
        """`view` with each bundle as one unit (its models' views, streams and paces as a unit's)."""
        table = self.table(view.rates)
        models = tuple(self.unit_view(p.id, view) if p.id in self.units else view.model(p.id) for p in table.models)
        by_id = {m.id: m for m in models}
        streams = tuple(self._stream(s, table, by_id, view.decode_rate) for s in view.streams)
        return ClusterView(view.time, view.total_gpus, view.gpus_per_node, view.round, table, models, streams,
                           view.free_gpus, view.decode_rate, view.partitions)

    def _stream(self, stream: StreamView, table: RateTable, models: dict[str, ModelView],
                decode_rate: float | None) -> StreamView:
        members = tuple(dict.fromkeys(self.unit_of.get(m, m) for m in stream.members))
        if stream.pace <= 0:
            return StreamView(stream.id, members, stream.pace)
        pace = min(table.rate(m, max(1, len(models[m].gpus))) for m in members)
        return StreamView(stream.id, members, pace if decode_rate is None else min(pace, decode_rate))


class Bundled(Policy):
    """`inner` planning each bundle as one unit (see the module docstring).

    Args:
        inner: the policy; one that plans visits of partitioned data is refused.
        bundles: the run's bundles (model ids, `form_bundles`).

    Raises:
        PolicyError: `inner` hops (model hopping plans no bundles).
    """

    uses_refined_rates = False  # a unit's measured rate is its bundle's: members' rates are not weighed

    def __init__(self, inner: Policy, bundles: Sequence[Sequence[str]]):
        if inner.hops:
            raise PolicyError(f"{inner.name}: visits of partitioned data are not planned in bundles")
        self.inner = inner
        self.name = inner.name
        self.plans_only_when_drained = inner.plans_only_when_drained
        self.reads_rates, self.own_decoding = inner.reads_rates, inner.own_decoding
        self.books = UnitBooks(bundles)
        self.told: dict[str, ModelState] = {}  # unit -> the state the policy last saw it in
        self.epochs: dict[str, int] = {}  # unit -> the last epoch the policy was told of
        self.asked: set[str] = set()  # units the policy checkpointed, until they left their GPUs

    def start(self, view: ClusterView) -> Decision:
        units = self.books.view(view)
        self.told = {u: units.model(u).state for u in self.books.units}
        return self._for_models(self.inner.start(units), view, units)

    def on_event(self, event: Event, view: ClusterView) -> Decision:
        unit = self.books.unit_of.get(event.model)
        told = event if unit is None else self._unit_event(unit, event, view)
        if told is None:
            return NO_DECISION
        units = self.books.view(view)
        return self._for_models(self.inner.on_event(told, units), view, units)

    # -- events ---------------------------------------------------------------------------

    def _unit_event(self, unit: str, event: Event, view: ClusterView) -> Event | None:
        """What the policy hears of a unit's model's event (None: nothing)."""
        before = self.told.get(unit)
        now = self.books.unit_view(unit, view)
        self.told[unit] = now.state
        if isinstance(event, EpochCompleted):
            if event.epoch <= self.epochs.get(unit, 0):
                return None
            self.epochs[unit] = event.epoch
            return EpochCompleted(unit, event.epoch, event.time, event.samples_per_s)
        if now.state in _ON_GPUS:
            return None  # the unit's GPU is still its own
        freed = event.gpus if isinstance(event, (ModelConverged, CheckpointCompleted)) else ()
        if now.state is ModelState.CONVERGED and (freed or before is not ModelState.CONVERGED):
            self.asked.discard(unit)
            rate = event.samples_per_s if isinstance(event, ModelConverged) else 0.0
            stopped = not isinstance(event, ModelConverged) or event.stopped
            return ModelConverged(unit, now.epochs_done, event.time, freed, rate, stopped)
        if freed:
            asked = unit in self.asked
            self.asked.discard(unit)
            if asked or now.state is ModelState.HELD:
                return CheckpointCompleted(unit, event.time, freed)
            return ModelPromoted(unit, event.time)  # its GPU is free, and models of it wait
        if before is ModelState.HELD and now.state in _WAITING:
            return ModelPromoted(unit, event.time)
        return None

    # -- decisions ------------------------------------------------------------------------

    def _for_models(self, decision: Decision, view: ClusterView, units: ClusterView) -> Decision:
        """The policy's decision about units as one about their models."""
        if decision.is_empty:
            return decision
        launch = tuple(StreamPlan(tuple(self._member(m, view) for m in plan.members), plan.join, plan.own_decoding)
                       for plan in decision.launch)
        checkpoint = tuple(model for target in decision.checkpoint for model in self._running(target, view))
        asked = [u for u in self.books.units if units.model(u).state is ModelState.RUNNING and
                 (decision.end_round or u in decision.checkpoint)]
        self.asked.update(asked)
        for plan in launch:
            for member in plan.members:
                unit = self.books.unit_of.get(member.model)
                if unit is not None:
                    self.told[unit] = ModelState.RUNNING
        return Decision(launch, checkpoint, decision.end_round)

    def _member(self, member: Member, view: ClusterView) -> Member:
        """A unit's launch: its waiting models, as one bundle member on its one GPU."""
        models = self.books.units.get(member.model)
        if models is None:
            return member
        waiting = tuple(m for m in models if view.model(m).state in _WAITING)
        if not waiting:
            raise PolicyError(f"{self.name}: cannot launch bundle {member.model}: none of its models waits")
        if len(waiting) > 1 and len(member.gpus) > 1:
            raise PolicyError(f"{self.name}: bundle {member.model} planned on {len(member.gpus)} GPUs; a bundle "
                              "trains on one")
        return Member(waiting[0], member.gpus, waiting if len(waiting) > 1 else ())

    def _running(self, target: str, view: ClusterView) -> tuple[str, ...]:
        """The running models a checkpoint of `target` (a unit, or a model) checkpoints."""
        models = self.books.units.get(target, (target,))
        return tuple(m for m in models if view.model(m).state is ModelState.RUNNING)
