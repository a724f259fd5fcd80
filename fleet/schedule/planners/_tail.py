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


def finish_curves(now: float, running: Sequence[Running], limit: int) -> np.ndarray:
    """``f[i, k-1]``: model ``i``'s finish on ``k = 1..limit`` GPUs, made non-increasing in ``k``
    (a count no faster than a smaller one is never worth taking)."""
    rates = np.full((len(running), limit), np.nan)
    for i, r in enumerate(running):
        rates[i, : min(limit, r.rates.size)] = r.rates[:limit]
    started = now + np.array([r.switch_s for r in running], dtype=float)
    ends = started[:, None] + np.array([r.remaining for r in running], dtype=float)[:, None] / rates
    ends[np.isnan(ends)] = np.inf
    held = [(i, r.gpus - 1, r.finish) for i, r in enumerate(running) if r.gpus <= limit]
    if held:
        rows, columns, finish = zip(*held)
        ends[list(rows), list(columns)] = finish
    return np.minimum.accumulate(ends, axis=1)


def common_goal(curves: np.ndarray, gpus: int) -> float:
    """The earliest time by which every model can finish when ``gpus`` GPUs are shared out."""
    models, limit = curves.shape
    spare = gpus - models  # entries above the goal the GPUs can pay for (each model has one)
    if spare >= curves.size - models:
        return float(curves[:, -1].max())
    k = curves.size - 1 - spare  # the (spare+1)-th largest entry, 0-based from the smallest
    return float(max(np.partition(curves, k, axis=None)[k], curves[:, -1].max()))


def rebalance(now: float, running: Sequence[Running], free: int, margin: float, gain: float = 0.0,
              shrink: bool = True) -> dict[str, int]:
    """New GPU counts for the models to resize (empty: nothing worth moving): only when the
    latest finish improves by more than ``margin`` switch costs and by more than ``gain`` times
    the time left to it."""
    if not running:
        return {}
    held = np.array([r.gpus for r in running])
    total = free + int(held.sum())
    curves = finish_curves(now, running, min(total, max(max(r.rates.size, r.gpus) for r in running)))
    if not shrink:  # no model gives GPUs up: fewer than it holds is never an option
        for i, r in enumerate(running):
            curves[i, : r.gpus - 1] = np.inf
    goal = common_goal(curves, total)
    need = 1 + np.sum(curves > goal * (1 + 1e-12), axis=1)
    finish = np.array([r.finish for r in running])
    grow = [i for i in np.argsort(-finish) if need[i] > held[i] and finish[i] > goal]
    if not grow:
        return {}
    cost = max(running[i].switch_s for i in grow)
    if finish.max() - goal <= max(margin * cost, gain * (finish.max() - now)):
        return {}
    counts = {running[i].model: int(need[i]) for i in grow}
    deficit = sum(int(need[i] - held[i]) for i in grow) - free
    for i in np.argsort(finish):  # the earliest finishers give GPUs up first
        if deficit <= 0:
            break
        if need[i] < held[i] and goal - finish[i] > margin * running[i].switch_s:
            counts[running[i].model] = int(need[i])
            deficit -= int(held[i] - need[i])
    return counts


def grow_into_free(now: float, running: Sequence[Running], free: int, margin: float, gain: float = 0.0,
                   tries: int = 4) -> dict[str, int]:
    """`rebalance` without shrinking; where nothing is worth moving, the models that cannot gain
    from the free GPUs (by more than ``margin`` switch costs, given all of them) are left out,
    and then up to ``tries`` of the latest of the others, one at a time, until some model is
    worth growing."""
    counts = rebalance(now, running, free, margin, gain, shrink=False)
    if counts or free <= 0:
        return counts
    gaining = sorted((r for r in running if _gains(now, r, free, margin)), key=lambda r: -r.finish)
    for skip in range(min(len(gaining), tries)):
        counts = rebalance(now, gaining[skip:], free, margin, gain, shrink=False)
        if counts:
            return counts
    return {}


def _gains(now: float, r: Running, free: int, margin: float) -> bool:
    """True when ``r`` would finish more than ``margin`` switch costs earlier on some count it can
    reach with ``free`` more GPUs."""
    top = min(r.rates.size, r.gpus + free)
    if top <= r.gpus:
        return False
    return r.finish - (now + r.switch_s + r.remaining / float(r.rates[r.gpus:top].max())) > margin * r.switch_s
