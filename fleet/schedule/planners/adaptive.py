"""fleet-adaptive: list scheduling against the malleable bound, on rate-matched streams.

Where FLEET-G trains one flotilla per round and waits for the round to drain, this policy
never stops the cluster. It plans against the malleable lower bound and keeps every GPU
busy:

1. **Target.** ``T`` = the malleable bound (LB2) computed from the *estimated* epochs and
   the profiled rates. Each model gets the fewest GPUs ``m_i`` (among counts that are
   faster than every smaller one) with which its estimated time fits in ``T``: short
   models train on one GPU, where they are most efficient; long ones get more GPUs.
2. **Order (LPT).** Pending models wait in order of estimated duration, longest first,
   so the models that set the makespan start first.
3. **Streams.** Whenever GPUs are free, the policy looks at the first ``window`` models in
   that order (or all that fit now) and puts the best-matching one -- possibly on up to
   ``extra_gpus`` more GPUs, if that matches better -- into a stream whose members' rates
   stay within ``match_tolerance`` (``ln(max/min)``): a running stream (the model *joins* it
   and reads it from its current position) or one opened in the same decision. Only if none
   matches does the head of the queue open a new stream. A decoding budget keeps about
   ``min_members`` members per stream, counted per sample: once the running streams decode
   more than ``1 / min_members`` of the samples their members train, the tolerance widens to
   ``hard_tolerance`` before a new stream is opened; below the budget, the tolerance narrows
   with the share of it in use (``match_tolerance`` times that share cubed, at least
   ``tight_tolerance``): where the budget has room, as with many models, streams match
   closer at the cost of more decoding. Matched rates keep pacing slack low; a
   stream slower than the median model's single-GPU rate is matched tighter, in proportion
   (its slack costs more GPU-seconds per sample than a fast stream's).
4. **Leftovers.** GPUs left over when the queue empties at a launch go to the new members
   predicted to finish last (no checkpoint needed), each into a drafted stream that matches
   its new rate within ``match_tolerance``, or a stream of its own.
4b. **Regrouping** (`_regroup`). After every decision, a member paced well below its own rate
   moves (checkpoint, restore) to a running stream nearer its rate, and a stream's lone slow
   member moves out to a slower stream, where the GPU-seconds saved exceed ``resize_margin``
   times the move's cost; no stream is opened, so decoding does not grow.
5. **The tail.** Once no model waits, the GPUs that come free are water-filled among the
   running models (`_tail.rebalance`): the earliest common finish they can reach with them
   (none giving GPUs up) is found, and each model predicted to finish after it grows to the
   fewest GPUs that finish it by then. A change of GPU count is a checkpoint and a restore, so
   a model grows only when the latest predicted finish improves by more than
   ``resize_margin`` times that cost (``Overheads``) and by ``rebalance_gain`` of the time
   left. Where the model predicted last cannot finish earlier (at its fastest count), the free
   GPUs still go to the others that gain from them (`_tail.grow_into_free`): idle, they would
   buy nothing, and a model predicted to finish just before the last is at risk of finishing
   after it. A resized model joins a stream that matches its new rate or opens its own.
   (Taking GPUs back from models far ahead, which `rebalance` can do, was measured on paper100
   and lost: four times the checkpoints for a makespan ~0.5 % longer.)

A run resumed from checkpoints queues its partly trained (``PAUSED``) models with the
untouched ones, by their estimated remaining time.

Estimates are refined as the run goes (`fleet.schedule.forecast.EpochForecast`): converged
models tell how far off the estimates are (the ratio of true to estimated epochs), so a
model's remaining epochs are forecast from the ratios seen above what it already trained
(``risk_level`` picks the quantile), and where epochs report the stop rule's validation metric,
from the model's own learning curve (a curve that flattens is forecast to stop; one that keeps
improving, to go on). Each model's rate curve is rescaled by the ratio of its measured to its
profiled rate after every epoch. The counts and the queue are planned once, at the start, for
``target_factor`` times the bound: few GPUs per model (the most efficient counts), the GPUs
that frees up and the forecasts' corrections going to the tail; only a critical model, one
that could not finish well within the bound even at its fastest (its fastest time over half
the bound), is planned wide from its start, on the fewest GPUs that finish by the bound (the
tail would widen it too late), where it starts in the first wave (its count fits the GPUs
beside those of the models queued before it); its GPUs are kept for it at a launch (models
behind it that match the drafted streams better do not take them), and no slower member
joins its stream past the pace that still finishes it by the bound.

Decoding. Where the view gives the preprocessors' measured throughput (``decode_rate``), no
model is planned faster than it (its rates are capped there: more GPUs than reach it are not
useful, and models faster than decoding all match), and once the drafted streams' paces add
up to it, no new stream is opened: a model joins the stream it matches best, whatever the
tolerance, since another stream would only split the decoding between them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

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
    Policy,
    StreamPlan,
    StreamView,
)
from fleet.schedule.costs import Overheads
from fleet.schedule.options import OptionError, PolicyOptions, option
from fleet.schedule.placement import place
from fleet.schedule.planners._adaptive_plan import ModelPlan
from fleet.schedule.planners._drafts import Draft, StreamMatcher, place_drafts, stream_to_join
from fleet.schedule.planners._regroup import Costs, Group, Seat, regroup
from fleet.schedule.planners._tail import RunningSet, grow_into_free
from fleet.schedule.rates import RateTable

_WAITING = (ModelState.PENDING, ModelState.PAUSED)  # PAUSED: resumed from a checkpoint, or resized


@dataclass(frozen=True)
class FleetAdaptiveOptions(PolicyOptions):
    """fleet-adaptive's options.

    Attributes:
        target_factor: plan GPU counts for ``target_factor * LB2``: at least 1, since no
            plan beats the bound; larger gives each model fewer, more efficient GPUs at first
            and leaves more to the tail (see the module docstring).
        match_tolerance: largest ``ln(max rate / min rate)`` among a stream's members, >= 0.
        tight_tolerance: the least it narrows to while the decoding budget has room (the
            tolerance is ``match_tolerance`` times the share of the budget in use, cubed, and
            at least this); from 0 to ``match_tolerance``.
        hard_tolerance: the same, allowed when the stream budget is used up; at least
            ``match_tolerance``.
        min_members: aim for at least this many members per stream, per sample (the
            decoding budget: once the running streams decode more than ``1 / min_members`` of
            what their members train, a new stream is opened only if no stream is within
            ``hard_tolerance``); at least 1.
        window: how many queued models (at least) are considered for the best match; >= 1.
        extra_gpus: how many GPUs beyond its planned count a model may take to match a pace; >= 0.
        resize_margin: a resize must gain more than this many times its cost; >= 0.
        risk_level: the quantile of the forecast of a model's remaining epochs it is planned
            for (0.5: the median; higher plans for the risk of a short estimate); in [0, 1].
        rebalance_gain: once no model waits, free GPUs go to running models only when the
            latest predicted finish improves by more than this share of the time left; >= 0.
        move_gain: a running member moves to another stream only when its pace there (or, for
            a stream's lone slow member, the pace its stream gets without it) is at least this
            share faster; >= 0.
    """

    target_factor: float = option(1.7, ge=1)
    match_tolerance: float = option(0.10, ge=0)
    tight_tolerance: float = option(0.02, ge=0)
    hard_tolerance: float = option(0.35, ge=0)
    min_members: float = option(5.5, ge=1)
    window: int = option(8, integer=True, ge=1)
    extra_gpus: int = option(2, integer=True, ge=0)
    resize_margin: float = option(2.0, ge=0)
    risk_level: float = option(0.5, ge=0, le=1)
    rebalance_gain: float = option(0.0, ge=0)
    move_gain: float = option(0.05, ge=0)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.hard_tolerance < self.match_tolerance:
            raise OptionError("hard_tolerance", f"must be at least match_tolerance ({self.match_tolerance:g}), "
                                                f"got {self.hard_tolerance:g}")
        if self.tight_tolerance > self.match_tolerance:
            raise OptionError("tight_tolerance", f"must be at most match_tolerance ({self.match_tolerance:g}), "
                                                 f"got {self.tight_tolerance:g}")


class FleetAdaptive(Policy):
    """Malleable-bound list scheduling with rate-matched shared streams.

    The models' plan (steps 1-2) is a `ModelPlan`; filling free GPUs into streams (steps 3-4)
    a `StreamMatcher`; this class answers the protocol and moves running members: regrouping
    (4b) and the tail's resizes (5), each a checkpoint and a launch on the new GPUs.

    Args:
        options: the knobs (:class:`FleetAdaptiveOptions`).
        seed: unused (deterministic); accepted for a uniform constructor.
        overheads: the checkpoint/restore costs assumed when weighing a resize (a cost
            model a caller passes in, not a user's option; default ``Overheads()``).
    """

    name = "fleet-adaptive"
    Options = FleetAdaptiveOptions
    # each epoch's measured rate rescales the model's curve here (`on_epoch`), as the runtime's
    # refinement would (measured entry in, the other counts by the same factor), and unweighed
    uses_refined_rates = False

    def __init__(self, options: FleetAdaptiveOptions = FleetAdaptiveOptions(), seed: int = 0,
                 overheads: Overheads | None = None):
        self.plan = ModelPlan(options.target_factor, options.risk_level)
        self.matcher = StreamMatcher(self.plan, options.match_tolerance, options.tight_tolerance,
                                     options.hard_tolerance, options.min_members, options.window, options.extra_gpus)
        self.tolerance = options.match_tolerance
        self.costs = overheads or Overheads()
        self.margin = options.resize_margin
        self.move_gain = options.move_gain
        self.rebalance_gain = options.rebalance_gain
        self.resizing: dict[str, int] = {}  # model being resized or moved -> the GPU count it gets
        self.moving: dict[str, int] = {}  # model being moved -> the stream it is to join
        self.table: _TableFacts | None = None  # of the view's rate table
        self.rows: dict[int, tuple[Group, np.ndarray]] = {}  # running stream -> (its group, its members' rows)
        self.groups: dict[int, tuple[StreamView, Group]] = {}  # running stream -> (its view, as regrouping sees it)
        self.groups_version = -1  # the plan's version the seats were read at

    # -- protocol --------------------------------------------------------------------

    def start(self, view: ClusterView) -> Decision:
        self.plan.plan(view)
        return self._fill(view)

    def on_event(self, event: Event, view: ClusterView) -> Decision:
        self.plan.follow(view)  # rates estimated anew since the last call
        return super().on_event(event, view)

    def on_epoch(self, event: EpochCompleted, view: ClusterView) -> Decision:
        self.plan.observe_epoch(event, view)
        return NO_DECISION

    def on_converged(self, event: ModelConverged, view: ClusterView) -> Decision:
        if not event.stopped:  # a model stopped at a rung tells nothing of how far off its estimate was
            self.plan.observe_converged(event, view)
        return self._fill(view)

    def on_promoted(self, event: ModelPromoted, view: ClusterView) -> Decision:
        """A model held at a rung may train on: it queues again by its estimated time left."""
        self.plan.requeue(view, event.model)
        return self._fill(view)

    def on_checkpointed(self, event: CheckpointCompleted, view: ClusterView) -> Decision:
        wanted = self.resizing.pop(event.model, None)
        if wanted is None:
            return self._fill(view)
        count = min(wanted, len(view.free_gpus))
        if count == 0:  # its GPUs went to others meanwhile: it waits at the head of the queue
            self.plan.queue.insert(0, event.model)
            return NO_DECISION
        gpus = place([count], view.free_gpus, view.gpus_per_node)[0]
        rate = self.plan.rate(view, event.model, count)
        join = stream_to_join(self._running_drafts(view), rate, self.tolerance, self.moving.pop(event.model, None))
        return Decision.launching([StreamPlan((Member(event.model, gpus),), join)])

    # -- filling free GPUs -------------------------------------------------------------

    def _fill(self, view: ClusterView) -> Decision:
        plan = self.plan
        plan.queue = [m for m in plan.queue if view.model(m).state in _WAITING and m not in self.resizing]
        drafts = self._running_drafts(view)
        self.matcher.fill(view, drafts)
        launch = place_drafts(view, drafts)
        decision = launch if launch.launch or plan.queue or not view.free_gpus else self._resize(view)
        moves = self._regroup(view, {p.join for p in decision.launch if p.join is not None})
        return Decision(launch=decision.launch, checkpoint=decision.checkpoint + moves) if moves else decision

    def _running_drafts(self, view: ClusterView) -> list[Draft]:
        """The running streams, as drafts that new members may join."""
        floors = self.matcher.running_floors(view)
        return [Draft(group.id, [seat.rate for seat in group.seats], running_floor=floors.get(group.id, 0.0))
                for group in self._groups(view)]

    def _groups(self, view: ClusterView) -> list[Group]:
        """The running streams as `_regroup` sees them: each member's GPUs and planned own rate.
        A stream's seats are kept while its view and the planned rates stay the same: with
        thousands of members, reading them all again on every call is what planning spent."""
        kept = self.groups if self.groups_version == self.plan.version else {}
        self.groups = {s.id: kept[s.id] if s.id in kept and kept[s.id][0] is s else (s, _group(view, s, self.plan.rate))
                       for s in view.streams if s.pace > 0}
        self.groups_version = self.plan.version
        return [group for _, group in self.groups.values()]

    # -- regrouping running members -----------------------------------------------------

    def _regroup(self, view: ClusterView, joined: set[int]) -> tuple[str, ...]:
        """Members to checkpoint now and move to a better stream (`on_checkpointed` joins it);
        none that would leave a stream in ``joined`` (one this decision launches into) empty."""
        costs = Costs(lambda m: self.plan.remaining(view.model(m)) * view.rates.samples_per_epoch,
                      lambda m: self._switch_s(view, m))
        moves = {m: t for m, t in regroup(self._groups(view), costs, self.margin, self.move_gain).items()
                 if m not in self.resizing}
        for stream in view.streams:
            if stream.id in joined and all(m in moves for m in stream.members):
                for m in stream.members:
                    del moves[m]
        for model, stream in moves.items():
            self.resizing[model] = len(view.model(model).gpus)
            self.moving[model] = stream
        return tuple(moves)

    # -- using leftover GPUs -------------------------------------------------------------

    def _resize(self, view: ClusterView) -> Decision:
        """Once no model waits: water-fill the free GPUs among the running models so that the
        one predicted to finish last finishes earlier (`_tail.rebalance`), where that gains more
        than ``resize_margin`` times the checkpoint + restore a change of GPU count requires."""
        available = len(view.free_gpus) - sum(self.resizing.values()) + self._resizing_now(view)
        counts = grow_into_free(view.time, self._running(view), max(available, 0), self.margin, self.rebalance_gain)
        self.resizing.update(counts)
        return Decision(checkpoint=tuple(counts)) if counts else NO_DECISION

    def _running(self, view: ClusterView) -> RunningSet:
        """The models running on a moving stream, but those being resized, by model id, as the
        tail sees them: each one's predicted finish at its stream's pace and samples left."""
        groups = self._groups(view)
        table = self._table(view)
        kept, self.rows = self.rows, {}
        for group in groups:
            entry = kept.get(group.id)
            if entry is None or entry[0] is not group:
                entry = (group, np.array([view.rates.index(seat.model) for seat in group.seats], dtype=int))
            self.rows[group.id] = entry
        rows = np.concatenate([members for _, members in self.rows.values()] or [np.zeros(0, dtype=int)])
        pace = np.repeat([group.pace for group in groups], [len(group.seats) for group in groups])
        keep = ~np.isin(rows, [view.rates.index(m) for m in self.resizing])
        order = np.flatnonzero(keep)[np.argsort(table.rank[rows[keep]])]
        rows, pace = rows[order], pace[order]
        remaining = self.plan.remaining_of([view.models[i] for i in rows]) * view.rates.samples_per_epoch
        sizes = self.plan.fastest[rows]  # more GPUs than the fastest count are never useful
        rates = self.plan.rates[rows, : int(sizes.max(initial=0))]
        rates[np.arange(rates.shape[1]) >= sizes[:, None]] = np.nan
        gpus = np.array([len(view.models[i].gpus) for i in rows], dtype=int)
        return RunningSet(tuple(view.rates.ids[i] for i in rows), gpus, view.time + remaining / pace, remaining,
                          table.switch_s[rows], rates, sizes)

    def _table(self, view: ClusterView) -> _TableFacts:
        """What the policy keeps of the view's rate table (`_TableFacts`)."""
        if self.table is None or self.table.rates is not view.rates:
            self.table = _TableFacts.of(view, self.costs)
            self.rows = {}  # rows of another table
        return self.table

    def _switch_s(self, view: ClusterView, model: str) -> float:
        """`_switch_cost` of ``model``."""
        return float(self._table(view).switch_s[view.rates.index(model)])

    def _resizing_now(self, view: ClusterView) -> int:
        """GPUs that models being resized still hold (they come back with the checkpoint)."""
        return sum(len(view.model(m).gpus) for m in self.resizing)




# -- helpers that need no state of the policy -------------------------------------------


def _switch_cost(view: ClusterView, costs: Overheads, model: str) -> float:
    """Seconds a change of GPU count (a checkpoint and a restore) costs ``model``."""
    param_bytes = view.rates.profile(model).param_bytes
    return costs.checkpoint_s(param_bytes) + costs.restore_s(param_bytes)


def _group(view: ClusterView, stream: StreamView, rate: Callable[[ClusterView, str, int], float]) -> Group:
    """A stream as `_regroup` sees it, ``rate`` giving a member's own rate."""
    def seat(model: str) -> Seat:
        gpus = len(view.model(model).gpus)
        return Seat(model, gpus, rate(view, model, gpus))

    return Group(stream.id, stream.pace, tuple(seat(m) for m in stream.members))


@dataclass(frozen=True)
class _TableFacts:
    """What the policy keeps of a rate table while it plans with it.

    Attributes:
        rates: the table.
        rank: ``rank[i]``: where model ``i``'s id comes in the sorted ids.
        switch_s: ``switch_s[i]``: `_switch_cost` of model ``i``.
    """

    rates: RateTable
    rank: np.ndarray
    switch_s: np.ndarray

    @classmethod
    def of(cls, view: ClusterView, costs: Overheads) -> _TableFacts:
        ids = view.rates.ids
        rank = np.empty(len(ids), dtype=int)
        rank[np.argsort(np.array(ids, dtype=object), kind="stable")] = np.arange(len(ids))
        return cls(view.rates, rank, np.array([_switch_cost(view, costs, m) for m in ids], dtype=float))
