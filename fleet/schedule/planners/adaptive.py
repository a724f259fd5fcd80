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
that frees up and the forecasts' corrections going to the tail.

Decoding. Where the view gives the preprocessors' measured throughput (``decode_rate``), no
model is planned faster than it (its rates are capped there: more GPUs than reach it are not
useful, and models faster than decoding all match), and once the drafted streams' paces add
up to it, no new stream is opened: a model joins the stream it matches best, whatever the
tolerance, since another stream would only split the decoding between them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from fleet.schedule._base import (
    NO_DECISION,
    CheckpointCompleted,
    ClusterView,
    Decision,
    EpochCompleted,
    Member,
    ModelConverged,
    ModelState,
    ModelView,
    Policy,
    StreamPlan,
)
from fleet.schedule.bounds import malleable_bound
from fleet.schedule.costs import Overheads
from fleet.schedule.flotilla import useful_counts
from fleet.schedule.forecast import EpochForecast
from fleet.schedule.options import OptionError, PolicyOptions, option
from fleet.schedule.placement import place
from fleet.schedule.planners._regroup import Costs, Group, Seat, regroup
from fleet.schedule.planners._tail import Running, grow_into_free


_MAX_CANDIDATES = 64  # queued models weighed at once, at most (planning time at 1,000 models)
_WAITING = (ModelState.PENDING, ModelState.PAUSED)  # PAUSED: resumed from a checkpoint, or resized


@dataclass
class _Draft:
    """A stream being put together in one decision (a new one, or a join)."""

    join: int | None
    rates: list[float]  # own rates of the stream's running members, then of the new ones
    members: list[tuple[str, int]] = field(default_factory=list)  # new (model, gpu count)

    def remove(self, k: int) -> None:
        """Take the ``k``-th new member out again."""
        self.rates.pop(len(self.rates) - len(self.members) + k)
        self.members.pop(k)

    def spread_with(self, rate: float) -> float:
        """``ln(max/min)`` of the members' own rates if a member of ``rate`` joined."""
        return math.log(max(*self.rates, rate) / min(*self.rates, rate))


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
        self.target_factor = options.target_factor
        self.tolerance = options.match_tolerance
        self.tight_tolerance = options.tight_tolerance
        self.hard_tolerance = options.hard_tolerance
        self.min_members = options.min_members
        self.window = options.window
        self.extra = options.extra_gpus
        self.costs = overheads or Overheads()
        self.margin = options.resize_margin
        self.counts: dict[str, int] = {}
        self.queue: list[str] = []
        self.resizing: dict[str, int] = {}
        self.moving: dict[str, int] = {}  # model being moved -> the stream it is to join
        self.move_gain, self.reference = options.move_gain, 0.0  # reference: median 1-GPU rate
        self.rates: np.ndarray | None = None
        self.target = 0.0
        self.forecast = EpochForecast()
        self.level = options.risk_level
        self.rebalance_gain = options.rebalance_gain

    # -- protocol --------------------------------------------------------------------

    def start(self, view: ClusterView) -> Decision:
        self._plan(view)
        return self._fill(view)

    def on_epoch(self, event: EpochCompleted, view: ClusterView) -> Decision:
        """Refine the model's rate curve by the ratio of measured to profiled rate, and its
        forecast of remaining epochs by the epoch's metric."""
        self.forecast.observe_epoch(event.model, event.epoch, event.metric)
        if self.rates is not None and event.samples_per_s > 0:
            i = view.rates.index(event.model)
            gpus = len(view.model(event.model).gpus)
            profiled = view.rates.matrix(view.total_gpus)[i]
            self.rates[i] = _capped(view, profiled * (event.samples_per_s / profiled[gpus - 1]))
        return NO_DECISION

    def on_converged(self, event: ModelConverged, view: ClusterView) -> Decision:
        self.forecast.observe_converged(event.model, view.model(event.model).epochs_estimate, event.epochs)
        return self._fill(view)

    def on_checkpointed(self, event: CheckpointCompleted, view: ClusterView) -> Decision:
        wanted = self.resizing.pop(event.model, None)
        if wanted is None:
            return self._fill(view)
        count = min(wanted, len(view.free_gpus))
        if count == 0:  # its GPUs went to others meanwhile: it waits at the head of the queue
            self.queue.insert(0, event.model)
            return NO_DECISION
        gpus = place([count], view.free_gpus, view.gpus_per_node)[0]
        rate = self._rate(view, event.model, count)
        drafts = [_Draft(s.id, self._member_rates(view, s.members)) for s in view.streams if s.pace > 0]
        join = _stream_to_join(drafts, rate, self.tolerance, self.moving.pop(event.model, None))
        return Decision.launching([StreamPlan((Member(event.model, gpus),), join)])

    # -- planning --------------------------------------------------------------------

    def _plan(self, view: ClusterView) -> None:
        """Target makespan, GPU count per model and the LPT queue."""
        total = view.total_gpus
        self.rates = _capped(view, view.rates.matrix(total).copy())
        times = self._work(view)[:, None] / self.rates
        target = malleable_bound(times) * self.target_factor
        self.target = target
        useful = useful_counts(self.rates)
        for i, model in enumerate(view.models):
            fits = np.flatnonzero(useful[i] & (times[i] <= target * (1 + 1e-9)))
            self.counts[model.id] = int(fits[0]) + 1 if fits.size else int(np.argmin(times[i])) + 1
        duration = {m.id: times[i, self.counts[m.id] - 1] for i, m in enumerate(view.models)}
        self.queue = sorted(duration, key=lambda m: (-duration[m], m))
        self.reference = float(np.median(self.rates[:, 0]))

    def _work(self, view: ClusterView) -> np.ndarray:
        """Estimated samples each model still needs (at least one epoch)."""
        n = view.rates.samples_per_epoch
        return np.array([self._remaining(m) * n for m in view.models])

    def _remaining(self, model: ModelView) -> float:
        """Forecast epochs a model still needs (`EpochForecast`, at the option's risk level)."""
        return self.forecast.remaining(model.id, model.epochs_estimate, model.epochs_done, self.level)

    def _member_rates(self, view: ClusterView, members: tuple[str, ...]) -> list[float]:
        return [self._rate(view, m, len(view.model(m).gpus)) for m in members]

    def _rate(self, view: ClusterView, model: str, gpus: int) -> float:
        return float(self.rates[view.rates.index(model), gpus - 1])

    # -- filling free GPUs -------------------------------------------------------------

    def _fill(self, view: ClusterView) -> Decision:
        self.queue = [m for m in self.queue if view.model(m).state in _WAITING and m not in self.resizing]
        free = len(view.free_gpus)
        drafts = [_Draft(s.id, self._member_rates(view, s.members)) for s in view.streams if s.pace > 0]
        while free > 0 and self.queue:
            model, gpus, draft = self._pick(view, drafts, free)
            if draft is None:
                draft = _Draft(None, [])
                drafts.append(draft)
            draft.members.append((model, gpus))
            draft.rates.append(self._rate(view, model, gpus))
            self.queue.remove(model)
            free -= gpus
        if not self.queue and free > 0:
            self._boost(view, drafts, free)
        launch = _place(view, drafts)
        decision = launch if launch.launch or self.queue or not view.free_gpus else self._resize(view)
        moves = self._regroup(view, {plan.join for plan in decision.launch if plan.join is not None})
        return Decision(launch=decision.launch, checkpoint=decision.checkpoint + moves) if moves else decision

    def _pick(self, view: ClusterView, drafts: list[_Draft], free: int):
        """Best (model, gpu count, stream draft or None for a new stream) to start now.

        Candidates are the first ``window`` queued models, or all that fit in the free GPUs
        if more do (at most ``_MAX_CANDIDATES``). A candidate may take a few more GPUs than planned when that matches a
        stream's pace better; the score adds the log-rate mismatch, the scaling loss of the
        extra GPUs and a small penalty for skipping ahead in the queue.
        """
        if _decoding_used_up(view, drafts):
            limit = math.inf
        else:
            used = _budget_used(drafts, self.min_members)
            limit = self.hard_tolerance if used > 1 else max(self.tight_tolerance, self.tolerance * used ** 3)
        options = [(rank, model, gpus) for rank, model in enumerate(self._candidates(free))
                   for gpus in self._count_options(view, model, free)]
        if drafts and options:
            rate = np.array([self._rate(view, m, g) for _, m, g in options])
            loss = 1 - rate / np.array([g * self._rate(view, m, 1) for _, m, g in options])
            low = np.array([min(d.rates) for d in drafts])
            high = np.array([max(d.rates) for d in drafts])
            pace = np.minimum(low, rate[:, None])
            mismatch = np.log(np.maximum(high, rate[:, None]) / pace) * np.maximum(1.0, self.reference / pace)
            score = mismatch + (loss + 0.01 * np.array([r for r, _, _ in options]))[:, None]
            score[mismatch > limit] = np.inf
            best = int(np.argmin(score))
            if np.isfinite(score.flat[best]):
                _, model, gpus = options[best // len(drafts)]
                return model, gpus, drafts[best % len(drafts)]
        head = self.queue[0]
        return head, min(self.counts[head], free), None

    def _candidates(self, free: int) -> list[str]:
        fitting, used = 0, 0
        for model in self.queue:
            used += self.counts[model]
            if used > free:
                break
            fitting += 1
        return self.queue[: max(self.window, min(fitting, _MAX_CANDIDATES))]

    def _count_options(self, view: ClusterView, model: str, free: int) -> list[int]:
        """Planned count, and up to ``extra_gpus`` more useful counts that still fit."""
        planned = min(self.counts[model], free)
        options = [planned]
        for gpus in range(planned + 1, min(planned + self.extra, free) + 1):
            if self._rate(view, model, gpus) > self._rate(view, model, options[-1]):
                options.append(gpus)
        return options

    def _boost(self, view: ClusterView, drafts: list[_Draft], free: int) -> None:
        """Leftover GPUs at launch go to the new members predicted to finish last.

        Such a member gets just enough GPUs to finish with the next-latest member or by the
        target, whichever is later, and moves to a drafted stream that matches its new rate
        within ``match_tolerance`` (a slower stream would only hold it back), or to a stream of
        its own where none does.
        """
        work = dict(zip(view.rates.ids, self._work(view)))
        while free > 0:
            finishes = sorted(
                ((work[m] / min(d.rates), d, k) for d in drafts for k, (m, _) in enumerate(d.members)),
                key=lambda f: -f[0],
            )
            if not finishes:
                return
            finish, draft, k = finishes[0]
            goal = max(finishes[1][0] if len(finishes) > 1 else 0.0, self.target)
            model, gpus = draft.members[k]
            options = [(work[model] / self._rate(view, model, g), g) for g in range(gpus + 1, gpus + free + 1)]
            reaching = [g for end, g in options if end <= goal]
            new_gpus = reaching[0] if reaching else min(options)[1]
            if work[model] / self._rate(view, model, new_gpus) >= finish * 0.98:
                return
            draft.remove(k)
            if not draft.members and draft.join is None:
                drafts.remove(draft)
            _add_to_match(drafts, self._rate(view, model, new_gpus), (model, new_gpus), self.tolerance)
            free -= new_gpus - gpus

    # -- regrouping running members -----------------------------------------------------

    def _regroup(self, view: ClusterView, joined: set[int]) -> tuple[str, ...]:
        """Members to checkpoint now and move to a better stream (`on_checkpointed` joins it);
        none that would leave a stream in ``joined`` (one this decision launches into) empty."""
        costs = Costs(lambda m: self._remaining(view.model(m)) * view.rates.samples_per_epoch,
                      lambda m: _switch_cost(view, self.costs, m))
        moves = {m: t for m, t in regroup(_groups(view, self._rate), costs, self.margin, self.move_gain).items()
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
        finish = _predicted_finish(view, self._remaining)
        running = [self._running(view, m, *finish[m]) for m in sorted(finish) if m not in self.resizing]
        counts = grow_into_free(view.time, running, max(available, 0), self.margin, self.rebalance_gain)
        self.resizing.update(counts)
        return Decision(checkpoint=tuple(counts)) if counts else NO_DECISION

    def _running(self, view: ClusterView, model: str, end: float, remaining: float) -> Running:
        row = self.rates[view.rates.index(model)]
        best = int(np.argmax(row)) + 1  # more GPUs than the fastest count are never useful
        return Running(model, len(view.model(model).gpus), end, remaining, _switch_cost(view, self.costs, model), row[:best])

    def _resizing_now(self, view: ClusterView) -> int:
        """GPUs that models being resized still hold (they come back with the checkpoint)."""
        return sum(len(view.model(m).gpus) for m in self.resizing)


# -- helpers that need no state of the policy -------------------------------------------


def _capped(view: ClusterView, rates: np.ndarray) -> np.ndarray:
    """Rates no faster than decoding, where the view knows its throughput."""
    return rates if view.decode_rate is None else np.minimum(rates, view.decode_rate)


def _budget_used(drafts: list[_Draft], min_members: float) -> float:
    """Share of the decoding budget the drafted streams use: what they decode against
    ``1 / min_members`` of what their members train (each stream decodes once what all its
    members train); above 1 the streams are crowded."""
    trained = sum(len(d.rates) * min(d.rates) for d in drafts if d.rates)
    return _paces(drafts) * min_members / trained if trained > 0 else 0.0


def _decoding_used_up(view: ClusterView, drafts: list[_Draft]) -> bool:
    """True when the drafted streams' paces already take all the decoding there is."""
    return view.decode_rate is not None and _paces(drafts) >= view.decode_rate * (1 - 1e-9)


def _paces(drafts: list[_Draft]) -> float:
    """Samples/s the drafted streams decode together (each at its slowest member's rate)."""
    return sum(min(d.rates) for d in drafts if d.rates)


def _switch_cost(view: ClusterView, costs: Overheads, model: str) -> float:
    """Seconds a change of GPU count (a checkpoint and a restore) costs ``model``."""
    param_bytes = view.rates.profile(model).param_bytes
    return costs.checkpoint_s(param_bytes) + costs.restore_s(param_bytes)


def _groups(view: ClusterView, rate: Callable[[ClusterView, str, int], float]) -> list[Group]:
    """The running streams as `_regroup` sees them, ``rate`` giving a member's own rate."""
    def seat(model: str) -> Seat:
        gpus = len(view.model(model).gpus)
        return Seat(model, gpus, rate(view, model, gpus))

    return [Group(s.id, s.pace, tuple(seat(m) for m in s.members)) for s in view.streams if s.pace > 0]


def _stream_to_join(drafts: list[_Draft], rate: float, tolerance: float, target: int | None) -> int | None:
    """The running stream a resized or moved member of own ``rate`` joins (None: its own):
    ``target``, the one it was moved for, if it still keeps up there; else the best match
    within ``tolerance``."""
    if any(d.join == target and min(d.rates) <= rate * (1 + 1e-9) for d in drafts):
        return target
    best = _best_match(drafts, rate, tolerance)
    return best.join if best else None


def _add_to_match(drafts: list[_Draft], rate: float, member: tuple[str, int], tolerance: float) -> None:
    """Add ``member`` (own ``rate``) to the draft it matches best within ``tolerance``, or to a
    new draft of its own."""
    best = _best_match(drafts, rate, tolerance)
    if best:
        best.members.append(member)
        best.rates.append(rate)
    else:
        drafts.append(_Draft(None, [rate], [member]))


def _best_match(drafts: list[_Draft], rate: float, tolerance: float) -> _Draft | None:
    """The draft whose spread with a member of own ``rate`` is least, within ``tolerance``."""
    fits = [d for d in drafts if d.rates and d.spread_with(rate) <= tolerance]
    return min(fits, key=lambda d: d.spread_with(rate)) if fits else None


def _place(view: ClusterView, drafts: list[_Draft]) -> Decision:
    """The drafts' new members on free GPUs (Alg. 3/4), one stream plan per draft."""
    members = [(d, model, gpus) for d in drafts for model, gpus in d.members]
    if not members:
        return NO_DECISION
    runs = place([g for _, _, g in members], view.free_gpus, view.gpus_per_node)
    plans: dict[int, list[Member]] = {}
    for (draft, model, _), run in zip(members, runs):
        plans.setdefault(id(draft), []).append(Member(model, run))
    by_id = {id(d): d for d in drafts}
    return Decision.launching(StreamPlan(tuple(ms), by_id[key].join) for key, ms in plans.items())


def _predicted_finish(
    view: ClusterView, remaining_epochs: Callable[[ModelView], float]
) -> dict[str, tuple[float, float]]:
    """Per running model: (when it is predicted to finish at its stream's pace, samples left),
    with ``remaining_epochs`` its forecast epochs left."""
    pace = {s.id: s.pace for s in view.streams}
    n = view.rates.samples_per_epoch
    out = {}
    for m in view.models:
        if m.state is not ModelState.RUNNING or not pace.get(m.stream):
            continue
        remaining = remaining_epochs(m) * n
        out[m.id] = (view.time + remaining / pace[m.stream], remaining)
    return out
