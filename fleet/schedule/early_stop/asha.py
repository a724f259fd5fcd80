"""``asha``: asynchronous successive halving (Li et al., MLSys 2020), as a stopping rule.

A model that reaches a rung is recorded there (among its cohort's: its group's, with learning
over groups) and decided at once, without waiting for the
others (Ray Tune's ``ASHAScheduler`` works the same way): with ``n`` models recorded at the
rung so far, itself included, it continues if ``n < η``, else if it is among the
``k = max(1, floor(n / η))`` best of them (ties: the one recorded first is better), and is
stopped otherwise. The cut-off is the k-th best value. Nothing waits, so no model pauses.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from fleet.schedule.early_stop._base import EarlyStopping
from fleet.schedule.early_stop.decisions import RecordError, RungDecision, Verdict, rank_value
from fleet.schedule.early_stop.rungs import rung_epochs

if TYPE_CHECKING:
    from fleet.schedule.early_stop.settings import EarlyStopSettings


class Asha(EarlyStopping):
    """Asynchronous successive halving: continue in the top 1/η of a rung's arrivals so far."""

    verdicts = frozenset({Verdict.CONTINUE, Verdict.STOPPED})

    def __init__(self, settings: EarlyStopSettings, models: Sequence[str], cohorts: Mapping[str, str] | None = None):
        super().__init__(settings, models, cohorts)
        self._rungs = rung_epochs(settings.min_epochs, settings.reduction, settings.max_epochs)
        self._arrivals: dict[tuple[str | None, int], list[tuple[str, float | None]]] = {}

    def _rungs_of(self, model: str) -> tuple[int, ...]:
        return self._rungs

    def _arrived(self, model: str, rung: int) -> list[tuple[str, float | None]]:
        """The arrivals so far at `rung` of `model`'s cohort."""
        return self._arrivals.setdefault((self.cohort(model), rung), [])

    def _observe(self, model: str, epoch: int, value: float | None) -> None:
        if epoch not in self._rungs:
            return
        arrivals = self._arrived(model, epoch)
        if any(m == model for m, _ in arrivals):
            return
        verdict, cutoff = self._verdict([*arrivals, (model, value)])
        self._decide(model, epoch, verdict, value, cutoff)

    def _verdict(self, arrivals: list[tuple[str, float | None]]) -> tuple[Verdict, float | None]:
        """The last arrival's verdict among all `arrivals` at its rung, and the cut-off."""
        n = len(arrivals)
        if n < self.settings.reduction:
            return Verdict.CONTINUE, None
        keep = max(1, math.floor(n / self.settings.reduction))
        order = sorted(range(n), key=lambda i: (rank_value(arrivals[i][1]), i))
        cutoff = arrivals[order[keep - 1]][1]
        return (Verdict.CONTINUE if order.index(n - 1) < keep else Verdict.STOPPED), cutoff

    def _check_record(self, record: RungDecision, place: int) -> None:
        super()._check_record(record, place)
        if any(model == record.model for model, _ in self._arrived(record.model, record.rung)):
            raise RecordError("rung", f"model {record.model!r} was decided at rung {record.rung} already")

    def _apply(self, decision: RungDecision) -> None:
        super()._apply(decision)
        self._arrived(decision.model, decision.rung).append((decision.model, decision.metric))
