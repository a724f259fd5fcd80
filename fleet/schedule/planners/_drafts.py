"""fleet-adaptive's streams as they are put together within one decision (steps 3 and 4).

A `Draft` is a stream being assembled: a running stream that new members join, or a new one.
`StreamMatcher` fills the free GPUs from the plan's queue: each pick is the queued model (and
GPU count) that best matches a drafted stream's pace within the tolerance the decoding budget
allows, or else the head of the queue in a stream of its own; GPUs left over when the queue
empties go to the new members predicted to finish last. `place_drafts` lays the drafts' new
members out on free GPUs (Alg. 3/4). The helpers that pick a stream for one member are shared
with the policy's resizes and moves.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from fleet.schedule._base import NO_DECISION, ClusterView, Decision, Member, StreamPlan
from fleet.schedule.placement import place
from fleet.schedule.planners._adaptive_plan import ModelPlan

_MAX_CANDIDATES = 64  # queued models weighed at once, at most (planning time at 1,000 models)
# A critical model may be paced to finish this share past the bound: models of rates within
# 5 % still share a stream (less to decode); the family's weak cells on TUNING_SEEDS as at 0.
FLOOR_SLACK = 0.05


@dataclass
class Draft:
    """A stream being put together in one decision (a new one, or a join).

    Attributes:
        join: the running stream it is, or None for a new one.
        rates: own rates of the stream's running members, then of the new ones.
        members: the new members, (model, gpu count).
        low, high: the least and the greatest of ``rates`` (``inf`` and 0 while it has none),
            kept as members come and go: a decision at 10,000 GPUs weighs every draft's for
            each of thousands of picks.
        running_floor: the least pace its running members may be held to (`StreamMatcher.floors`).
        floors: the least pace each new member may be held to.
        floor: the least pace the stream may run at: the greatest of these.
    """

    join: int | None
    rates: list[float]
    members: list[tuple[str, int]] = field(default_factory=list)
    running_floor: float = 0.0
    floors: list[float] = field(default_factory=list)
    low: float = field(init=False)
    high: float = field(init=False)
    floor: float = field(init=False)

    def __post_init__(self) -> None:
        self.low, self.high = min(self.rates, default=math.inf), max(self.rates, default=0.0)
        self.floor = max([self.running_floor, *self.floors])

    def add(self, member: tuple[str, int], rate: float, floor: float = 0.0) -> None:
        """A new member of own ``rate`` that may be held to a pace no lower than ``floor``."""
        self.members.append(member)
        self.rates.append(rate)
        self.floors.append(floor)
        self.low, self.high, self.floor = min(self.low, rate), max(self.high, rate), max(self.floor, floor)

    def remove(self, k: int) -> None:
        """Take the ``k``-th new member out again."""
        self.rates.pop(len(self.rates) - len(self.members) + k)
        self.members.pop(k)
        self.floors.pop(k)
        self.__post_init__()

    def spread_with(self, rate: float) -> float:
        """``ln(max/min)`` of the members' own rates if a member of ``rate`` joined."""
        return math.log(max(self.high, rate) / min(self.low, rate))


class StreamMatcher:
    """Fills free GPUs from the plan's queue into drafted streams; see the module docstring.

    Args:
        plan: the models' plan (its queue shrinks as models are picked).
        tolerance: ``match_tolerance``; tight_tolerance, hard_tolerance, min_members,
        window, extra_gpus: fleet-adaptive's options of the same names.
    """

    def __init__(self, plan: ModelPlan, tolerance: float, tight_tolerance: float, hard_tolerance: float,
                 min_members: float, window: int, extra_gpus: int):
        self.plan = plan
        self.tolerance, self.tight_tolerance, self.hard_tolerance = tolerance, tight_tolerance, hard_tolerance
        self.min_members, self.window, self.extra = min_members, window, extra_gpus
        self.floors: dict[str, float] = {}  # critical model drafted -> the least pace it may be held to

    def fill(self, view: ClusterView, drafts: list[Draft]) -> None:
        """Put queued models into `drafts` (new ones appended) while GPUs are free; leftover
        GPUs, once the queue is empty, to the new members predicted to finish last. The planned
        GPUs of the critical models waiting are kept for them (`_reserve`)."""
        plan = self.plan
        reserved, place = self._reserve(len(view.free_gpus))
        free = len(view.free_gpus) - sum(plan.counts[m] for m in reserved)
        while True:
            while reserved and (free <= 0 or not plan.queue or place[reserved[0]] < place[plan.queue[0]]):
                self._draft_reserved(view, drafts, reserved.pop(0))
            if free <= 0 or not plan.queue:
                break
            model, gpus, draft = self._pick(view, drafts, free)
            self._draft(view, drafts, model, gpus, draft)
            plan.queue.remove(model)
            free -= gpus
        if not plan.queue and free > 0:
            self._boost(view, drafts, free)

    def _reserve(self, free: int) -> tuple[list[str], dict[str, int]]:
        """The critical models waiting (`ModelPlan.critical`) whose planned counts fit in ``free``
        GPUs, the first in the queue first, taken out of the queue, and every queued model's
        place in it (none where no model is reserved). The others are drafted on the GPUs left;
        a reserved model is drafted once the head of the queue is past its place, or once no
        GPU is left to the others (`_draft_reserved`). Planned to finish by the bound from its
        start, a critical model left to the matching waits while models behind it match the
        drafts better, and starts late on whatever GPUs are left."""
        plan = self.plan
        reserved = []
        for model in (m for m in plan.queue if m in plan.critical) if plan.critical else ():
            if plan.counts[model] <= free:
                reserved.append(model)
                free -= plan.counts[model]
        if not reserved:
            return [], {}
        place = {m: k for k, m in enumerate(plan.queue)}
        taken = set(reserved)
        plan.queue = [m for m in plan.queue if m not in taken]
        return reserved, place

    def _draft_reserved(self, view: ClusterView, drafts: list[Draft], model: str) -> None:
        """A reserved model on its planned count, into the draft it matches best (`_match`) or
        a new one."""
        gpus = self.plan.counts[model]
        match = self._match(view, drafts, gpus, self._limit(view, drafts), [model]) if drafts else None
        self._draft(view, drafts, model, gpus, match[2] if match else None)

    def _draft(self, view: ClusterView, drafts: list[Draft], model: str, gpus: int, draft: Draft | None) -> None:
        """Add ``model`` on ``gpus`` GPUs to ``draft`` (None: a new one), with its floor."""
        if draft is None:
            draft = Draft(None, [])
            drafts.append(draft)
        rate = self.plan.rate(view, model, gpus)
        floor = self.floor(view, [model], np.array([rate]))[0]
        self._keep_floor(model, floor)
        draft.add((model, gpus), rate, floor)

    def floor(self, view: ClusterView, models: list[str], rates: np.ndarray) -> np.ndarray:
        """The least pace each of ``models``, on its own ``rates``, may be held to in a stream:
        for a model the plan holds critical (`ModelPlan.critical`), the pace that still
        finishes its forecast work by the bound (the plan's target over its target factor),
        never above its own rate (once the bound is passed, its own rate); 0 for the others.
        A critical model paced by a slower member finishes after the bound, and the makespan
        with it (a stream's pace is its slowest member's)."""
        critical = np.array([m in self.plan.critical for m in models], dtype=bool)
        floors = np.zeros(len(models))
        if not critical.any():
            return floors
        rows = np.flatnonzero(critical)
        work = self.plan.remaining_of([view.model(models[k]) for k in rows]) * view.rates.samples_per_epoch
        left = self.plan.target / self.plan.target_factor * (1 + FLOOR_SLACK) - view.time
        floors[rows] = np.minimum(rates[rows], work / left) if left > 0 else rates[rows]
        return floors

    def _keep_floor(self, model: str, floor: float) -> None:
        if floor > 0:
            self.floors[model] = floor
        else:
            self.floors.pop(model, None)

    def running_floors(self, view: ClusterView) -> dict[int, float]:
        """Running stream -> the least pace its members may be held to (`floor`, as each was
        drafted; only the streams of critical models)."""
        floors: dict[int, float] = {}
        for model, floor in self.floors.items():
            stream = view.model(model).stream
            if stream is not None:
                floors[stream] = max(floors.get(stream, 0.0), floor)
        return floors

    def _pick(self, view: ClusterView, drafts: list[Draft], free: int):
        """Best (model, gpu count, stream draft or None for a new stream) to start now: the
        best match of a queued model with a draft (`_match`), or else the head of the queue."""
        match = self._match(view, drafts, free, self._limit(view, drafts), self._candidates(free)) if drafts else None
        if match is not None:
            return match
        head = self.plan.queue[0]
        return head, min(self.plan.counts[head], free), None

    def _limit(self, view: ClusterView, drafts: list[Draft]) -> float:
        """The largest mismatch a pick may have, by the decoding budget in use."""
        if _decoding_used_up(view, drafts):
            return math.inf
        used = _budget_used(drafts, self.min_members)
        return self.hard_tolerance if used > 1 else max(self.tight_tolerance, self.tolerance * used ** 3)

    def _match(self, view: ClusterView, drafts: list[Draft], free: int, limit: float, candidates: list[str]):
        """The (model, gpu count, draft) of least score within ``limit`` among ``candidates``
        (queued models, in the queue's order), or None.

        A candidate may take a few more GPUs than planned when that matches a stream's pace
        better; the score adds the log-rate mismatch, the scaling loss of the extra GPUs and a
        small penalty for skipping ahead in the queue.
        """
        ranks, gpus, rate = self._count_options(view, candidates, free)
        single = self.plan.rates_at(view, candidates, np.ones((len(candidates), 1), dtype=int))[ranks, 0]
        loss = 1 - rate / (gpus * single)
        low = np.array([d.low for d in drafts])
        high = np.array([d.high for d in drafts])
        pace = np.minimum(low, rate[:, None])
        mismatch = np.log(np.maximum(high, rate[:, None]) / pace) * np.maximum(1.0, self.plan.reference / pace)
        score = mismatch + (loss + 0.01 * ranks)[:, None]
        own = np.minimum(self.floor(view, candidates, np.full(len(candidates), np.inf))[ranks], rate)
        floor = np.maximum(own[:, None], np.array([d.floor for d in drafts]))
        score[(mismatch > limit) | (pace < floor * (1 - 1e-9))] = np.inf
        best = int(np.argmin(score))
        if not np.isfinite(score.flat[best]):
            return None
        option = best // len(drafts)
        return candidates[ranks[option]], int(gpus[option]), drafts[best % len(drafts)]

    def _candidates(self, free: int) -> list[str]:
        """The queued models weighed for a pick: the first ``window``, or all that fit in the
        ``free`` GPUs at their planned counts if more do (at most ``_MAX_CANDIDATES``)."""
        fitting, used = 0, 0
        for model in self.plan.queue[:_MAX_CANDIDATES]:  # more would not be weighed
            used += self.plan.counts[model]
            if used > free:
                break
            fitting += 1
        return self.plan.queue[: max(self.window, min(fitting, _MAX_CANDIDATES))]

    def _count_options(self, view: ClusterView, candidates: list[str], free: int):
        """Each candidate's planned count (at most ``free``), and up to ``extra_gpus`` more
        GPUs that fit where each is faster than every smaller count offered: the arrays
        (candidate's rank, gpu count, planned rate), by rank and then count."""
        planned = np.minimum([self.plan.counts[m] for m in candidates], free)
        counts = planned[:, None] + np.arange(self.extra + 1)
        rates = self.plan.rates_at(view, candidates, counts)
        faster = np.ones(counts.shape, dtype=bool)
        faster[:, 1:] = rates[:, 1:] > np.maximum.accumulate(rates, axis=1)[:, :-1]
        ranks, steps = np.nonzero(faster & (counts <= free))
        return ranks, counts[ranks, steps], rates[ranks, steps]

    def _boost(self, view: ClusterView, drafts: list[Draft], free: int) -> None:
        """Leftover GPUs at launch go to the new members predicted to finish last.

        Such a member gets just enough GPUs to finish with the next-latest member or by the
        target, whichever is later, and moves to a drafted stream that matches its new rate
        within ``match_tolerance`` (a slower stream would only hold it back), or to a stream of
        its own where none does.
        """
        n = view.rates.samples_per_epoch
        work = {m: self.plan.remaining(view.model(m)) * n for d in drafts for m, _ in d.members}  # the new ones
        while free > 0:
            finishes = sorted(
                ((work[m] / d.low, d, k) for d in drafts for k, (m, _) in enumerate(d.members)),
                key=lambda f: -f[0],
            )
            if not finishes:
                return
            finish, draft, k = finishes[0]
            goal = max(finishes[1][0] if len(finishes) > 1 else 0.0, self.plan.target)
            model, gpus = draft.members[k]
            options = [(work[model] / self.plan.rate(view, model, g), g) for g in range(gpus + 1, gpus + free + 1)]
            reaching = [g for end, g in options if end <= goal]
            new_gpus = reaching[0] if reaching else min(options)[1]
            if work[model] / self.plan.rate(view, model, new_gpus) >= finish * 0.98:
                return
            draft.remove(k)
            if not draft.members and draft.join is None:
                drafts.remove(draft)
            rate = self.plan.rate(view, model, new_gpus)
            floor = self.floor(view, [model], np.array([rate]))[0]
            self._keep_floor(model, floor)
            _add_to_match(drafts, rate, (model, new_gpus), self.tolerance, floor)
            free -= new_gpus - gpus


def _budget_used(drafts: list[Draft], min_members: float) -> float:
    """Share of the decoding budget the drafted streams use: what they decode against
    ``1 / min_members`` of what their members train (each stream decodes once what all its
    members train); above 1 the streams are crowded."""
    trained = sum(len(d.rates) * d.low for d in drafts if d.rates)
    return _paces(drafts) * min_members / trained if trained > 0 else 0.0


def _decoding_used_up(view: ClusterView, drafts: list[Draft]) -> bool:
    """True when the drafted streams' paces already take all the decoding there is."""
    return view.decode_rate is not None and _paces(drafts) >= view.decode_rate * (1 - 1e-9)


def _paces(drafts: list[Draft]) -> float:
    """Samples/s the drafted streams decode together (each at its slowest member's rate)."""
    return sum(d.low for d in drafts if d.rates)


def stream_to_join(drafts: list[Draft], rate: float, tolerance: float, target: int | None) -> int | None:
    """The running stream a resized or moved member of own ``rate`` joins (None: its own):
    ``target``, the one it was moved for, if it still keeps up there; else the best match
    within ``tolerance``."""
    if any(d.join == target and d.low <= rate * (1 + 1e-9) for d in drafts):
        return target
    best = _best_match(drafts, rate, tolerance)
    return best.join if best else None


def _add_to_match(drafts: list[Draft], rate: float, member: tuple[str, int], tolerance: float, floor: float) -> None:
    """Add ``member`` (own ``rate``, held to no pace below ``floor``) to the draft it matches best
    within ``tolerance``, or to a new draft of its own."""
    best = _best_match(drafts, rate, tolerance, floor)
    if best:
        best.add(member, rate, floor)
    else:
        drafts.append(Draft(None, [rate], [member], floors=[floor]))


def _best_match(drafts: list[Draft], rate: float, tolerance: float, floor: float = 0.0) -> Draft | None:
    """The draft whose spread with a member of own ``rate`` is least, within ``tolerance``, where
    neither the member (``floor``) nor the draft's members (`Draft.floor`) are paced below their
    floors."""
    fits = [d for d in drafts if d.rates and d.spread_with(rate) <= tolerance
            and min(d.low, rate) >= max(floor, d.floor) * (1 - 1e-9)]
    return min(fits, key=lambda d: d.spread_with(rate)) if fits else None


def place_drafts(view: ClusterView, drafts: list[Draft]) -> Decision:
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
