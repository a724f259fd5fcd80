"""fleet-adaptive's tail: GPUs moved to the running models predicted to finish last.

Once no model waits, the makespan is the latest finish among the running models. Their GPUs
(and the free ones) are shared out again as a malleable schedule would: ``goal`` is the
earliest time by which every running model can finish if each may take any GPU count, and
each model gets the fewest GPUs that finish it by then. A model predicted to finish after
the goal grows; with ``shrink``, where the free GPUs do not cover that, models predicted to
finish well before it shrink; without, no model gives GPUs up and the free GPUs are
water-filled (a model changes its count only through a checkpoint and a restore: the switch
cost is in every finish that needs one). Nothing moves unless the latest finish improves by
more than ``margin`` times the largest switch cost involved and by more than a share ``gain``
of the time left to it (each move checkpoints models: small gains are not worth the churn).
`grow_into_free` is the policy's entry point without shrinking: where the model predicted last
cannot finish earlier (it is at its fastest count, or its gain is below the gate), it does not
hold the free GPUs back from the others: they go to the models that still gain from them,
which would otherwise wait idle beside it.

Pure: numbers in, new GPU counts out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Running:
    """A running model as the tail sees it.

    Attributes:
        model: model id.
        gpus: GPUs it holds now.
        finish: when it is predicted to finish where it is (its stream's pace).
        remaining: samples it is forecast to still need.
        switch_s: seconds a change of GPU count costs it (checkpoint + restore).
        rates: its own rates on 1, 2, ... GPUs.
    """

    model: str
    gpus: int
    finish: float
    remaining: float
    switch_s: float
    rates: np.ndarray


@dataclass(frozen=True)
class RunningSet:
    """Running models as arrays, one entry (row) per model: what the tail weighs on every call,
    for thousands of running models at once.

    Attributes:
        models: model ids.
        gpus, finish, remaining, switch_s: as `Running`'s, per model.
        rates: ``rates[i, k-1]``: model ``i``'s own rate on ``k`` GPUs, NaN past its own counts.
        sizes: how many counts each model has rates for.
    """

    models: tuple[str, ...]
    gpus: np.ndarray
    finish: np.ndarray
    remaining: np.ndarray
    switch_s: np.ndarray
    rates: np.ndarray
    sizes: np.ndarray

    @classmethod
    def of(cls, running: Sequence[Running]) -> RunningSet:
        """The set of `running` (in that order)."""
        sizes = np.array([r.rates.size for r in running], dtype=int)
        rates = np.full((len(running), int(sizes.max(initial=0))), np.nan)
        for i, r in enumerate(running):
            rates[i, : r.rates.size] = r.rates
        return cls(tuple(r.model for r in running), np.array([r.gpus for r in running], dtype=int),
                   *(np.array([getattr(r, name) for r in running], dtype=float)
                     for name in ("finish", "remaining", "switch_s")), rates, sizes)

    def __len__(self) -> int:
        return len(self.models)

    def take(self, rows: Sequence[int] | np.ndarray) -> RunningSet:
        """The models at `rows`, in that order."""
        rows = np.asarray(rows, dtype=int)
        return RunningSet(tuple(np.array(self.models, dtype=object)[rows]), self.gpus[rows], self.finish[rows],
                          self.remaining[rows], self.switch_s[rows], self.rates[rows], self.sizes[rows])


def _as_set(running: RunningSet | Sequence[Running]) -> RunningSet:
    return running if isinstance(running, RunningSet) else RunningSet.of(running)


def finish_curves(now: float, running: RunningSet | Sequence[Running], limit: int) -> np.ndarray:
    """``f[i, k-1]``: model ``i``'s finish on ``k = 1..limit`` GPUs, made non-increasing in ``k``
    (a count no faster than a smaller one is never worth taking)."""
    running = _as_set(running)
    rates = np.full((len(running), limit), np.nan)
    width = min(limit, running.rates.shape[1])
    rates[:, :width] = running.rates[:, :width]
    ends = (now + running.switch_s)[:, None] + running.remaining[:, None] / rates
    ends[np.isnan(ends)] = np.inf
    held = np.flatnonzero(running.gpus <= limit)
    ends[held, running.gpus[held] - 1] = running.finish[held]
    return np.minimum.accumulate(ends, axis=1)


def common_goal(curves: np.ndarray, gpus: int) -> float:
    """The earliest time by which every model can finish when ``gpus`` GPUs are shared out."""
    models, limit = curves.shape
    spare = gpus - models  # entries above the goal the GPUs can pay for (each model has one)
    if spare >= curves.size - models:
        return float(curves[:, -1].max())
    k = curves.size - 1 - spare  # the (spare+1)-th largest entry, 0-based from the smallest
    return float(max(np.partition(curves, k, axis=None)[k], curves[:, -1].max()))


def rebalance(now: float, running: RunningSet | Sequence[Running], free: int, margin: float, gain: float = 0.0,
              shrink: bool = True, curves: np.ndarray | None = None) -> dict[str, int]:
    """New GPU counts for the models to resize (empty: nothing worth moving): only when the
    latest finish improves by more than ``margin`` switch costs and by more than ``gain`` times
    the time left to it. ``curves``: the models' `_curves` already computed, at least as wide
    as needed (the first columns are the same whatever the width)."""
    running = _as_set(running)
    if not len(running):
        return {}
    held = running.gpus
    total = free + int(held.sum())
    limit = _limit(running, total)
    curves = _curves(now, running, limit, shrink) if curves is None else curves[:, :limit]
    goal = common_goal(curves, total)
    need = 1 + np.sum(curves > goal * (1 + 1e-12), axis=1)
    finish = running.finish
    order = np.argsort(-finish)
    grow = order[((need > held) & (finish > goal))[order]].tolist()
    if not grow:
        return {}
    cost = max(running.switch_s[i] for i in grow)
    if finish.max() - goal <= max(margin * cost, gain * (finish.max() - now)):
        return {}
    counts = {running.models[i]: int(need[i]) for i in grow}
    deficit = sum(int(need[i] - held[i]) for i in grow) - free
    for i in np.argsort(finish):  # the earliest finishers give GPUs up first
        if deficit <= 0:
            break
        if need[i] < held[i] and goal - finish[i] > margin * running.switch_s[i]:
            counts[running.models[i]] = int(need[i])
            deficit -= int(held[i] - need[i])
    return counts


def _limit(running: RunningSet, total: int) -> int:
    """How many GPU counts the curves of `running` need with ``total`` GPUs to share."""
    return min(total, int(np.maximum(running.sizes, running.gpus).max()))


def _curves(now: float, running: RunningSet, limit: int, shrink: bool) -> np.ndarray:
    """`finish_curves`; without ``shrink``, no count below the one a model holds (never an option)."""
    curves = finish_curves(now, running, limit)
    if not shrink:
        curves[np.arange(curves.shape[1]) < running.gpus[:, None] - 1] = np.inf
    return curves


def grow_into_free(now: float, running: RunningSet | Sequence[Running], free: int, margin: float,
                   gain: float = 0.0, tries: int = 4) -> dict[str, int]:
    """`rebalance` without shrinking; where nothing is worth moving, the models that cannot gain
    from the free GPUs (by more than ``margin`` switch costs, given all of them) are left out,
    and then up to ``tries`` of the latest of the others, one at a time, until some model is
    worth growing."""
    running = _as_set(running)
    counts = rebalance(now, running, free, margin, gain, shrink=False)
    if counts or free <= 0:
        return counts
    rows = np.flatnonzero(_gains(now, running, free, margin))
    rows = rows[np.argsort(-running.finish[rows], kind="stable")]
    if not rows.size:
        return {}
    gaining = running.take(rows)
    curves = _curves(now, gaining, _limit(gaining, free + int(gaining.gpus.sum())), shrink=False)
    for skip in range(min(len(gaining), tries)):
        counts = rebalance(now, gaining.take(np.arange(skip, len(gaining))), free, margin, gain, shrink=False,
                           curves=curves[skip:])
        if counts:
            return counts
    return {}


def _gains(now: float, running: RunningSet, free: int, margin: float) -> np.ndarray:
    """Per model: True when it would finish more than ``margin`` switch costs earlier on some
    count it can reach with ``free`` more GPUs."""
    top = np.minimum(running.sizes, running.gpus + free)
    counts = np.arange(running.rates.shape[1])
    reach = (counts >= running.gpus[:, None]) & (counts < top[:, None])
    best = np.where(reach, running.rates, -np.inf).max(axis=1, initial=-np.inf)
    with np.errstate(divide="ignore"):
        sooner = running.finish - ((now + running.switch_s) + running.remaining / best)
    return (top > running.gpus) & (sooner > margin * running.switch_s)
