"""Who survives each rung, from the rung arithmetic alone (no learning curves).

For predictions where no learning curve exists (the dry run, ``fleet simulate`` without
curves): how many of an ensemble's models are expected to train past each rung.

- ``sha``: exact: a rung of ``n`` models promotes ``max(1, floor(n / η))``.
- ``hyperband``: each bracket as ``sha`` on the models dealt to it, summed.
- ``asha``: the expectation when the models arrive at a rung in random order: the ``j``-th
  arrival continues when ``j < η`` and otherwise with probability ``floor(j / η) / j`` (its
  place among the first ``j`` is uniform).
- ``median``: of the ``n`` models reaching an epoch, the first ``min_models`` are never
  stopped and about half of the others are (a rough figure: a model's best so far beats the
  others' median somewhat more often than its current value does).
- ``none``: no rung.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fleet.schedule.early_stop.rungs import deal, hyperband_brackets, rung_epochs

if TYPE_CHECKING:
    from fleet.schedule.early_stop.settings import EarlyStopSettings


@dataclass(frozen=True)
class RungShare:
    """The expected share of an ensemble's models that train on past `epochs`.

    Attributes:
        epochs: a rung (epochs trained).
        share: of all the models (0 to 1), those expected to train beyond it.
    """

    epochs: int
    share: float


def surviving_share(settings: EarlyStopSettings, models: int) -> tuple[RungShare, ...]:
    """The share of `models` models expected to pass each rung, rungs ascending.

    Models that end on their own before a rung (their stop rule) are not counted out: the
    shares are what early stopping alone leaves.
    """
    if models < 1 or settings.method == "none":
        return ()
    counts = _SURVIVORS[settings.method](settings, models)
    return tuple(RungShare(epochs, left / models) for epochs, left in counts)


def _halving(settings: EarlyStopSettings, models: int, rungs: tuple[int, ...]) -> list[tuple[int, float]]:
    """(rung, models left past it) for successive halving of `models` over `rungs`."""
    out, left = [], models
    for epochs in rungs:
        left = max(1, math.floor(left / settings.reduction)) if left else 0
        out.append((epochs, float(left)))
    return out


def _sha(settings: EarlyStopSettings, models: int) -> list[tuple[int, float]]:
    return _halving(settings, models, rung_epochs(settings.min_epochs, settings.reduction, settings.max_epochs))


def _hyperband(settings: EarlyStopSettings, models: int) -> list[tuple[int, float]]:
    """Every bracket's survivors past each rung of any bracket, summed."""
    plans = hyperband_brackets(settings)
    dealt = deal(models, [plan.size for plan in plans])
    per_bracket = [(dealt.count(plan.index), _halving(settings, dealt.count(plan.index), plan.rungs))
                   for plan in plans]
    epochs = sorted({e for _, counts in per_bracket for e, _ in counts})
    return [(e, sum(_left_past(e, size, counts) for size, counts in per_bracket)) for e in epochs]


def _left_past(epochs: int, size: int, counts: list[tuple[int, float]]) -> float:
    """A bracket's models left past `epochs`: after its last rung at or below it."""
    passed = [left for rung, left in counts if rung <= epochs]
    return passed[-1] if passed else float(size)


def _asha(settings: EarlyStopSettings, models: int) -> list[tuple[int, float]]:
    out, left = [], float(models)
    for epochs in rung_epochs(settings.min_epochs, settings.reduction, settings.max_epochs):
        arrivals = round(left)
        left = sum(1.0 if j < settings.reduction else math.floor(j / settings.reduction) / j
                   for j in range(1, arrivals + 1))
        out.append((epochs, left))
    return out


def _median(settings: EarlyStopSettings, models: int) -> list[tuple[int, float]]:
    out, left, keep = [], float(models), settings.min_models
    for epochs in range(max(1, settings.grace_epochs), settings.max_epochs):
        left = min(left, keep) + max(0.0, left - keep) / 2
        out.append((epochs, left))
    return out


_SURVIVORS = {"asha": _asha, "sha": _sha, "hyperband": _hyperband, "median": _median}
