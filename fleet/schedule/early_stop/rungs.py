"""Rung arithmetic: where the rungs lie, and Hyperband's brackets (Li et al. 2018).

Everything here is a function of numbers (`min_epochs`, the reduction factor η, `max_epochs`)
or of an object with those fields (an ``EarlyStopSettings``); nothing keeps state.

Brackets are numbered as in Optuna's ``HyperbandPruner`` (its ``min_early_stopping_rate``):
bracket ``b`` has its first rung at ``min_epochs × η^b``, so bracket 0 is the most aggressive.
Li et al.'s table numbers the same brackets the other way round: their ``s`` is
``s_max - b``. Bracket ``b``'s size is theirs for ``s = s_max - b``:
``n = ceil((s_max + 1) / (s + 1) × η^s)``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

TOLERANCE = 1e-9
"""Slack for products of a float η: ``1 × 3.0^4`` is 81 whichever way it is rounded."""


class RungSettings(Protocol):
    """The fields of ``EarlyStopSettings`` the arithmetic reads."""

    min_epochs: int
    reduction: float
    max_epochs: int
    brackets: int | None


def round_half_up(value: float) -> int:
    """``value`` rounded to the nearest integer, halves upwards (2.5 -> 3, unlike `round`)."""
    return math.floor(value + 0.5)


def rung_epochs(min_epochs: int, reduction: float, max_epochs: int, first_power: int = 0) -> tuple[int, ...]:
    """The rungs ``min_epochs × η^k`` for ``k >= first_power``, rounded, distinct, below `max_epochs`.

    Args:
        min_epochs: the first rung of bracket 0 (epochs).
        reduction: η, > 1.
        max_epochs: no rung lies at or above it (a model there ends anyway).
        first_power: the first k (Hyperband's bracket).

    Returns:
        The rungs in ascending order (possibly none).
    """
    rungs: list[int] = []
    power = first_power
    while (epochs := max(1, round_half_up(min_epochs * reduction ** power))) < max_epochs:
        if not rungs or epochs > rungs[-1]:
            rungs.append(epochs)
        power += 1
    return tuple(rungs)


def max_bracket(min_epochs: int, reduction: float, max_epochs: int) -> int:
    """Hyperband's ``s_max = floor(log_η(max_epochs / min_epochs))`` (-1 if min > max)."""
    power = -1
    while min_epochs * reduction ** (power + 1) <= max_epochs * (1 + TOLERANCE):
        power += 1
    return power


def bracket_size(s_max: int, reduction: float, bracket: int) -> int:
    """Li et al.'s ``n`` for bracket `bracket` (their ``s = s_max - bracket``)."""
    s = s_max - bracket
    return math.ceil((s_max + 1) * reduction ** s / (s + 1) - TOLERANCE)


@dataclass(frozen=True)
class BracketPlan:
    """One Hyperband bracket, as Li et al.'s table gives it.

    Attributes:
        index: ``b``, from 0 (first rung ``min_epochs``).
        first_rung: ``min_epochs × η^b`` rounded; at or above ``max_epochs`` when the bracket
            trains its models to the end without a rung (Li et al.'s ``s = 0``).
        size: Li et al.'s ``n``: the bracket's share of the models, as a weight.
        rungs: the bracket's rungs below ``max_epochs``.
    """

    index: int
    first_rung: int
    size: int
    rungs: tuple[int, ...]


def hyperband_brackets(settings: RungSettings) -> tuple[BracketPlan, ...]:
    """The brackets Hyperband runs: ``settings.brackets`` of them (default ``s_max + 1``)."""
    low, eta, high = settings.min_epochs, settings.reduction, settings.max_epochs
    s_max = max_bracket(low, eta, high)
    count = s_max + 1 if settings.brackets is None else settings.brackets
    return tuple(BracketPlan(index=b, first_rung=max(1, round_half_up(low * eta ** b)),
                             size=bracket_size(s_max, eta, b), rungs=rung_epochs(low, eta, high, b))
                 for b in range(count))


def deal(count: int, weights: Sequence[int]) -> tuple[int, ...]:
    """Deal `count` items, in order, to bins by smooth weighted round-robin.

    Each item goes to the bin furthest behind its share (ties: the lowest bin), so after any
    prefix every bin holds its weighted share to within one item, and after ``sum(weights)``
    items exactly ``weights[b]``. Equal weights make it plain round-robin.

    Returns:
        The bin of each item.
    """
    total, credit, bins = sum(weights), [0] * len(weights), []
    for _ in range(count):
        credit = [c + w for c, w in zip(credit, weights)]
        chosen = max(range(len(weights)), key=lambda b: (credit[b], -b))
        credit[chosen] -= total
        bins.append(chosen)
    return tuple(bins)
