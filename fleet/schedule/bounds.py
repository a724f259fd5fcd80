"""Lower bounds on the makespan of an ensemble, whatever the policy.

With ``t_i(m) = E_i * n / r_i(m)`` the time model *i* needs on *m* GPUs (``E_i`` epochs of
``n`` samples) and ``m = 1..M``:

* **LB1** ``= max(sum_i min_m m*t_i(m) / M, max_i min_m t_i(m))``: the GPU-seconds every
  model needs at least, spread over all GPUs, and the longest model at its fastest.
* **LB2** (malleable bound) ``= min T such that sum_i A_i(T) <= M*T``, where ``A_i(T)`` is the
  least GPU-seconds model *i* needs to finish within ``T`` if it may change its GPU count
  over time: the lower convex envelope of the points ``(t_i(m), m*t_i(m))`` evaluated at
  ``T`` (flat to the right of the cheapest point, infinite left of ``min_m t_i(m)``).

A schedule that trains model *i* a fraction ``f_m`` of its samples on *m* GPUs takes
``sum f_m t_i(m)`` seconds and ``sum f_m m t_i(m)`` GPU-seconds, a point above the envelope;
slower pacing, checkpoints and idle GPUs only add to both. Hence ``LB1 <= LB2 <= makespan``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fleet.schedule.rates import RateTable


@dataclass(frozen=True)
class Bounds:
    """The two lower bounds, in seconds."""

    lb1: float
    lb2: float


def training_times(rates: RateTable, epochs: Sequence[float], total_gpus: int) -> np.ndarray:
    """``t[i, m-1] = epochs_i * n / r_i(m)`` for ``m = 1..w``, ``w <= total_gpus`` the last count
    at which some model is faster than at every smaller count (`RateTable.useful_matrix`): a
    slower count costs more GPU-seconds too, so it bounds nothing."""
    work = np.asarray(epochs, dtype=float) * rates.samples_per_epoch
    return work[:, None] / rates.useful_matrix(total_gpus)


def simple_bound(times: np.ndarray, total_gpus: int | None = None) -> float:
    """LB1 from a ``t[i, m-1]`` array (``m = 1..w``) on ``total_gpus`` GPUs (default ``w``; more
    where `training_times` left out counts no model gains from); 0 for no model."""
    if not times.shape[0]:
        return 0.0
    total_gpus = total_gpus or times.shape[1]
    gpu_seconds = times * np.arange(1, times.shape[1] + 1)
    return float(max(gpu_seconds.min(axis=1).sum() / total_gpus, times.min(axis=1).max()))


def malleable_bound(times: np.ndarray, rel_tol: float = 1e-10, total_gpus: int | None = None) -> float:
    """LB2 from a ``t[i, m-1]`` array (``m = 1..w``) on ``total_gpus`` GPUs (default ``w``), by
    bisection on ``T``; 0 for no model."""
    if not times.shape[0]:
        return 0.0
    total_gpus = total_gpus or times.shape[1]
    envelopes = [_envelope(row) for row in times]
    low = float(times.min(axis=1).max())
    if _excess(envelopes, low, total_gpus) <= 0:
        return low
    high = max(low, simple_bound(times, total_gpus)) * 2
    while _excess(envelopes, high, total_gpus) > 0:
        high *= 2
    while high - low > rel_tol * high:
        mid = (low + high) / 2
        low, high = (mid, high) if _excess(envelopes, mid, total_gpus) > 0 else (low, mid)
    return high


def lower_bounds(rates: RateTable, epochs: Sequence[float], total_gpus: int) -> Bounds:
    """LB1 and LB2 of an ensemble with the given (true) epochs on ``total_gpus`` GPUs."""
    times = training_times(rates, epochs, total_gpus)
    return Bounds(simple_bound(times, total_gpus), malleable_bound(times, total_gpus=total_gpus))


def least_gpu_seconds(times_row: np.ndarray, deadline: float) -> float:
    """``A_i(T)``: least GPU-seconds to finish within ``deadline`` (``inf`` if impossible)."""
    return _evaluate(_envelope(times_row), deadline)


def _envelope(times_row: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Vertices of the lower convex envelope of ``(t(m), m t(m))``, ``t`` ascending.

    Only the non-increasing part (from the fastest point to the cheapest) matters.
    """
    counts = np.arange(1, len(times_row) + 1)
    points = sorted(zip(times_row.tolist(), (times_row * counts).tolist()))
    hull: list[tuple[float, float]] = []
    for t, w in points:
        if hull and w >= hull[-1][1]:
            continue  # slower and no cheaper: dominated
        while len(hull) >= 2 and _turns_clockwise(hull[-2], hull[-1], (t, w)):
            hull.pop()
        hull.append((t, w))
    xs, ys = zip(*hull)
    return np.array(xs), np.array(ys)


def _turns_clockwise(a: tuple, b: tuple, c: tuple) -> bool:
    """True when ``b`` lies on or above the segment ``a -> c`` (so it is not a vertex)."""
    return (b[0] - a[0]) * (c[1] - a[1]) - (b[1] - a[1]) * (c[0] - a[0]) <= 0


def _evaluate(envelope: tuple[np.ndarray, np.ndarray], deadline: float) -> float:
    xs, ys = envelope
    if deadline < xs[0] * (1 - 1e-12):
        return float("inf")
    return float(np.interp(deadline, xs, ys))


def _excess(envelopes: list, deadline: float, total_gpus: int) -> float:
    """``sum_i A_i(T) - M T``; positive means ``T`` is infeasible."""
    return sum(_evaluate(e, deadline) for e in envelopes) - total_gpus * deadline
