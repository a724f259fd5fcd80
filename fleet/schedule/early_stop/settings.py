"""The settings of early stopping across models, checked when built."""

from __future__ import annotations

import math
from dataclasses import dataclass

from fleet.schedule.early_stop.registry import METHODS
from fleet.schedule.early_stop.rungs import max_bracket


MAX_POWERS = 200
"""Most powers of η between ``min_epochs`` and ``max_epochs`` (rungs, Hyperband brackets)."""


class EarlyStopError(ValueError):
    """A setting out of its range, as ``<field>: <problem>``.

    Attributes:
        field: the setting's name (as `EarlyStopSettings` and the spec's section spell it).
        problem: what is wrong, without the field's name.
    """

    def __init__(self, field: str, problem: str):
        super().__init__(f"{field}: {problem}")
        self.field, self.problem = field, problem


def _integer(name: str, value: object, least: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise EarlyStopError(name, f"must be an integer >= {least}, got {value!r}")


@dataclass(frozen=True)
class EarlyStopSettings:
    """How models are stopped early; metrics are lower-is-better.

    Attributes:
        method: ``none``, ``asha``, ``sha``, ``hyperband`` or ``median`` (`METHODS`).
        max_epochs: the largest ``train.max_epochs`` of the ensemble; every rung is below it.
        min_epochs: the first rung (epochs), below `max_epochs` unless the method is ``none``.
        reduction: η (> 1): a rung keeps the top 1/η; rungs lie at ``min_epochs × η^k``.
        brackets: ``hyperband``'s bracket count, 1 to ``s_max + 1`` (default, filled in
            when built: ``s_max + 1``, ``s_max = floor(log_η(max_epochs / min_epochs))``);
            None for the other methods.
        grace_epochs: ``median`` decides from this epoch on (default: `min_epochs`).
        min_models: ``median`` decides at an epoch only when at least this many other models
            have reported it.

    Raises:
        EarlyStopError: a value out of range, naming its field.
    """

    method: str
    max_epochs: int
    min_epochs: int = 1
    reduction: float = 3.0
    brackets: int | None = None
    grace_epochs: int | None = None
    min_models: int = 5

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise EarlyStopError("method", f"unknown method {self.method!r} (valid: {', '.join(METHODS)})")
        _integer("max_epochs", self.max_epochs, 1)
        _integer("min_epochs", self.min_epochs, 1)
        self._check_reduction()
        if self.method != "none" and self.min_epochs >= self.max_epochs:
            raise EarlyStopError("min_epochs", f"must be below the largest train.max_epochs of the ensemble "
                                               f"({self.max_epochs}), got {self.min_epochs}")
        self._check_powers()
        if self.grace_epochs is None:
            object.__setattr__(self, "grace_epochs", self.min_epochs)
        _integer("grace_epochs", self.grace_epochs, 0)
        _integer("min_models", self.min_models, 1)
        self._check_brackets()

    @property
    def s_max(self) -> int:
        """Hyperband's ``floor(log_η(max_epochs / min_epochs))``."""
        return max_bracket(self.min_epochs, self.reduction, self.max_epochs)

    def _check_reduction(self) -> None:
        value = self.reduction
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 1:
            raise EarlyStopError("reduction", f"must be a number > 1, got {value!r}")

    def _check_powers(self) -> None:
        """At most `MAX_POWERS` powers of η between the first rung and ``max_epochs``: an η
        that close to 1 would make thousands of rungs (or Hyperband brackets) of equal epochs."""
        powers = math.log(max(self.max_epochs, self.min_epochs) / self.min_epochs) / math.log(self.reduction)
        if powers > MAX_POWERS:
            least = (self.max_epochs / self.min_epochs) ** (1 / MAX_POWERS)
            raise EarlyStopError("reduction", f"{self.reduction!r} is too close to 1: about {powers:,.0f} rungs "
                                              f"would lie between min_epochs {self.min_epochs} and max_epochs "
                                              f"{self.max_epochs} (at most {MAX_POWERS}: use at least {least:.3g})")

    def _check_brackets(self) -> None:
        if self.method != "hyperband":
            if self.brackets is not None:
                raise EarlyStopError("brackets", f"applies to method hyperband only (method: {self.method})")
            return
        most = self.s_max + 1
        if self.brackets is None:
            object.__setattr__(self, "brackets", most)
        if isinstance(self.brackets, bool) or not isinstance(self.brackets, int) or not 1 <= self.brackets <= most:
            raise EarlyStopError("brackets", f"must be an integer from 1 to {most} (s_max + 1 for min_epochs "
                                             f"{self.min_epochs}, reduction {self.reduction:g} and max_epochs "
                                             f"{self.max_epochs}), got {self.brackets!r}")
