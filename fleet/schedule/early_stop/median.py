"""``median``: median stopping, as Optuna's ``MedianPruner`` defines it (Golovin et al. 2017).

After each epoch ``e >= grace_epochs``, a model whose best metric so far is worse (lower is
better: greater) than the median of the metrics the *other* models (of its cohort: its group, with learning over groups)
reported at epoch ``e`` is
``STOPPED``, provided at least ``min_models`` others have reported epoch ``e``; otherwise
nothing is decided. Unlike Optuna, which compares with completed trials only, the others are
every model that has reached epoch ``e`` so far (an ensemble trains its models at once), so
the first ``min_models`` models to reach an epoch are never stopped there. Every epoch from
``max(1, grace_epochs)`` below ``max_epochs`` is a rung.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from fleet.schedule.early_stop._base import EarlyStopping
from fleet.schedule.early_stop.decisions import Verdict, rank_value

if TYPE_CHECKING:
    from fleet.schedule.early_stop.settings import EarlyStopSettings


class MedianStopping(EarlyStopping):
    """Stop a model whose best so far is worse than the others' median at the same epoch."""

    verdicts = frozenset({Verdict.STOPPED})

    def __init__(self, settings: EarlyStopSettings, models: Sequence[str], cohorts: Mapping[str, str] | None = None):
        super().__init__(settings, models, cohorts)
        self._first = max(1, settings.grace_epochs)
        self._at: dict[tuple[str | None, int], dict[str, float | None]] = {}  # (cohort, epoch) -> model -> metric
        self._best: dict[str, float | None] = {}

    def _rungs_of(self, model: str) -> tuple[int, ...]:
        return tuple(range(self._first, self.settings.max_epochs))

    def next_stop(self, model: str, epochs_done: int) -> int | None:
        self._model(model)
        epochs = max(self._first, epochs_done + 1)
        return epochs if epochs < self.settings.max_epochs else None

    def _remember(self, model: str, epoch: int, value: float | None) -> None:
        """Keep `model`'s metric at `epoch` (the first one reported counts) and its best."""
        reported = self._at.setdefault((self.cohort(model), epoch), {})
        if model in reported:
            return
        reported[model] = value
        best = self._best.get(model)
        if value is not None and (best is None or value < best):
            self._best[model] = value

    def _observe(self, model: str, epoch: int, value: float | None) -> None:
        reported = self._at.get((self.cohort(model), epoch), {})
        if model in reported:
            return
        self._remember(model, epoch, value)
        if not self._first <= epoch < self.settings.max_epochs:
            return
        others = [v for m, v in self._at[self.cohort(model), epoch].items() if m != model and v is not None]
        if len(others) < self.settings.min_models:
            return
        median, best = statistics.median(others), self._best.get(model)
        if rank_value(best) > median:
            self._decide(model, epoch, Verdict.STOPPED, best, median)
