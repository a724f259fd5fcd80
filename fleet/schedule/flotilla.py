"""FLEET's greedy flotilla creation (Alg. 2): rate-matched GPU counts for one shared stream.

All members of a flotilla read the same decoded sample stream, so the stream moves at the
pace of its slowest member. Alg. 2 balances the members' rates around the fastest
single-GPU model:

1. Start with the model whose ``r(1)`` is highest (rate ``r_fast``) on one GPU.
2. Repeatedly add the pair (model, m) that minimises ``|r_i(m) - r_fast|`` among the models
   not yet in the flotilla, subject to ``|r_i(m) - r_fast| <= delta`` and to
   ``m <= free GPUs``. Stop when nothing qualifies or no GPU is free. Only *useful* counts
   are considered: ``m`` qualifies if ``r_i(m)`` beats every smaller count of the same
   model. (Eq. 5 bends down past some ``m``; without this rule a model could be matched on
   the falling side of its curve, e.g. on 52 GPUs for the rate it reaches on 6.)
3. Hand leftover GPUs to the currently slowest member, again at useful counts only: a
   member whose measured rate dips at m + 1 but rises past r(m) at m + 2 takes two GPUs
   at once if two are free. Members tied at the slowest rate (the copies of one
   architecture in a sweep) move up together, or not at all: lifting one of them does not
   speed up the stream, it only lets that one run ahead of the others by up to its queues
   and converge first, which ends a FLEET-G round while its peers are a queue short of
   done. (When the free GPUs cannot raise the slowest rate, past the peak of Eq. 5 or for
   want of GPUs for every tied member, they stay free: giving them to anyone else cannot
   speed up the stream.)

Ties are broken by the smaller GPU count, then by the order of ``candidates``, so the result
is deterministic.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fleet.schedule.rates import RateTable

DEFAULT_RELATIVE_DELTA = 0.1
"""When no ``delta`` is given, Alg. 2 uses ``delta = 0.1 * r_fast`` samples/s."""
TIE = 1e-9  # relative: members whose rates differ by less are tied (step 3)


@dataclass(frozen=True)
class FlotillaMember:
    """One model of a flotilla and its GPU count.

    Attributes:
        model: model id.
        gpus: number of GPUs (``m``), leftovers included.
        rate: ``r(m)`` in samples per second.
        matched_gpus: the count step 2 matched to ``r_fast`` (before leftovers).
    """

    model: str
    gpus: int
    rate: float
    matched_gpus: int


@dataclass(frozen=True)
class Flotilla:
    """Models that will share one decoded stream, with their GPU counts.

    Attributes:
        members: in the order Alg. 2 added them (the fastest model first).
        reference_rate: ``r_fast``, the rate the others were matched to.
        delta: the tolerance used, in samples/s.
    """

    members: tuple[FlotillaMember, ...]
    reference_rate: float
    delta: float

    @property
    def gpus(self) -> int:
        """GPUs the flotilla uses."""
        return sum(m.gpus for m in self.members)

    @property
    def pace(self) -> float:
        """Samples per second the shared stream moves at (its slowest member)."""
        return min((m.rate for m in self.members), default=0.0)


def create_flotilla(
    rates: RateTable,
    candidates: Sequence[str],
    free_gpus: int,
    delta: float | None = None,
) -> Flotilla:
    """Alg. 2: pick rate-matched models and GPU counts for one shared stream.

    Args:
        rates: the rate table.
        candidates: ids of models that may join (not converged, not running elsewhere).
        free_gpus: GPUs available to this flotilla.
        delta: tolerance on ``|r_i(m) - r_fast|`` in samples/s; ``None`` means
            ``DEFAULT_RELATIVE_DELTA * r_fast``.

    Returns:
        The flotilla; empty when there are no candidates or no free GPU.
    """
    if not candidates or free_gpus < 1:
        return Flotilla((), 0.0, 0.0 if delta is None else float(delta))
    table = rates.useful_matrix(free_gpus)[[rates.index(c) for c in candidates]]
    first = int(np.argmax(table[:, 0]))
    r_fast = float(table[first, 0])
    tolerance = DEFAULT_RELATIVE_DELTA * r_fast if delta is None else float(delta)
    counts = {first: 1}
    _add_matched_members(table, counts, free_gpus - 1, r_fast, tolerance)
    matched = dict(counts)
    _hand_out_leftovers(table, counts, free_gpus - sum(counts.values()))
    members = tuple(
        FlotillaMember(candidates[i], m, float(table[i, m - 1]), matched[i]) for i, m in counts.items()
    )
    return Flotilla(members, r_fast, tolerance)


def _add_matched_members(
    table: np.ndarray, counts: dict[int, int], free: int, r_fast: float, tolerance: float
) -> None:
    """Step 2 of Alg. 2; fills ``counts`` (candidate row -> GPU count) in place.

    Each step adds the available (model, m) of smallest gap that fits the free GPUs, the
    smaller m and then the earlier candidate on ties. Models only leave and the free GPUs only
    shrink, so the pairs within tolerance are sorted once and taken in that order.
    """
    gaps = np.abs(table[:, :free] - r_fast)
    matched = (gaps <= tolerance) & useful_counts(table[:, :free])
    matched[list(counts)] = False
    rows, columns = np.nonzero(matched)
    taken = set(counts)
    for k in np.lexsort((rows, columns, gaps[rows, columns])):
        row, m = int(rows[k]), int(columns[k]) + 1
        if m <= free and row not in taken:
            counts[row] = m
            taken.add(row)
            free -= m


def useful_counts(table: np.ndarray) -> np.ndarray:
    """``mask[i, m-1]``: True when ``r_i(m)`` is higher than ``r_i`` at every smaller count."""
    best_before = np.maximum.accumulate(table, axis=1)
    mask = np.ones_like(table, dtype=bool)
    mask[:, 1:] = table[:, 1:] > best_before[:, :-1]
    return mask


def _hand_out_leftovers(table: np.ndarray, counts: dict[int, int], free: int) -> None:
    """Step 3 of Alg. 2: leftover GPUs go to the currently slowest members (all of those tied
    at the slowest rate, or none), each to its next useful count (one GPU more unless its
    measured curve dips there first)."""
    useful = {row: useful_counts(table[row : row + 1])[0] for row in counts}
    slowest = [(table[row, m - 1], row) for row, m in counts.items()]  # a heap: (rate, row) of each member
    heapq.heapify(slowest)
    while free > 0:
        pace = slowest[0][0]
        tied = []
        while slowest and slowest[0][0] <= pace * (1 + TIE):
            tied.append(heapq.heappop(slowest)[1])
        lifts, left = {}, free
        for row in sorted(tied):
            higher = np.flatnonzero(useful[row][counts[row] : counts[row] + left])
            if not higher.size:
                return
            lifts[row] = 1 + int(higher[0])
            left -= lifts[row]
        for row, extra in lifts.items():
            counts[row] += extra
            heapq.heappush(slowest, (table[row, counts[row] - 1], row))
        free = left
