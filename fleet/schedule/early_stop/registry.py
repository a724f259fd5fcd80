"""The early-stopping methods by name: the one list of valid names (the spec's and the settings')."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from fleet.schedule.early_stop._base import EarlyStopping, NoEarlyStopping
from fleet.schedule.early_stop.asha import Asha
from fleet.schedule.early_stop.halving import Hyperband, SuccessiveHalving
from fleet.schedule.early_stop.median import MedianStopping

if TYPE_CHECKING:
    from fleet.schedule.early_stop.settings import EarlyStopSettings

METHODS: dict[str, type[EarlyStopping]] = {
    "none": NoEarlyStopping,
    "asha": Asha,
    "sha": SuccessiveHalving,
    "hyperband": Hyperband,
    "median": MedianStopping,
}
"""Early-stopping classes by method name; each takes (settings, models, cohorts)."""


def create_early_stopping(settings: EarlyStopSettings, models: Sequence[str],
                          cohorts: Mapping[str, str] | None = None) -> EarlyStopping:
    """The early stopping of a run: `settings.method`'s class over `models` (in spec order);
    with `cohorts` (each model's group), each rung compares models of one cohort only."""
    return METHODS[settings.method](settings, models, cohorts)
