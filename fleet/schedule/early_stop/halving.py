"""``sha`` and ``hyperband``: synchronous successive halving with promotion (Li et al. 2018).

Every model that reaches a rung is ``PAUSED`` there: it is checkpointed and holds no GPU.
Once every model expected at the rung has reported -- all of the bracket's models at its
first rung, the ones promoted from the rung below at the others, less the models that ended
on their own before reaching it -- the best ``max(1, floor(n / η))`` of the ``n`` that
reported are ``PROMOTED`` (they train on from their checkpoints) and the rest ``STOPPED``;
ties go to the model that reported first, and the cut-off is the last promoted one's value.
A model promoted from the last rung trains to its ``max_epochs``.

With cohorts (learning over groups: each model's group), every cohort has brackets of its own:
a rung waits for, and ranks, the models of one cohort only.

``hyperband`` runs one such halving per bracket (`fleet.schedule.early_stop.rungs`): the
models are dealt to the brackets in spec order by weighted round-robin on Li et al.'s bracket
sizes, bracket ``b`` has its first rung at ``min_epochs × η^b``, and the brackets decide
independently.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fleet.schedule.early_stop._base import EarlyStopping
from fleet.schedule.early_stop.decisions import RecordError, RungDecision, Verdict, rank_value
from fleet.schedule.early_stop.rungs import deal, hyperband_brackets, rung_epochs

if TYPE_CHECKING:
    from fleet.schedule.early_stop.settings import EarlyStopSettings

Due = tuple[str, Verdict, "float | None", "float | None"]
"""A decision a rung has due: (model, verdict, its metric, the cut-off)."""


@dataclass
class _Rung:
    """One rung of a bracket: who reported there (in arrival order) and what became of them."""

    epochs: int
    reports: dict[str, float | None] = field(default_factory=dict)
    verdicts: dict[str, Verdict] = field(default_factory=dict)

    def promoted(self) -> list[str]:
        return [model for model, verdict in self.verdicts.items() if verdict is Verdict.PROMOTED]

    def ranked(self, reduction: float) -> list[Due]:
        """The verdict of every model that reported, in arrival order."""
        models = list(self.reports)
        keep = max(1, math.floor(len(models) / reduction)) if models else 0
        order = sorted(range(len(models)), key=lambda i: (rank_value(self.reports[models[i]]), i))
        cutoff = self.reports[models[order[keep - 1]]] if models else None
        places = {models[i]: place for place, i in enumerate(order)}
        return [(m, Verdict.PROMOTED if places[m] < keep else Verdict.STOPPED, self.reports[m], cutoff)
                for m in models]


class _Bracket:
    """One successive halving over `models`, with rungs at `rungs` epochs."""

    def __init__(self, index: int, models: Sequence[str], rungs: Sequence[int]):
        self.index, self.models = index, tuple(models)
        self.rungs = [_Rung(epochs) for epochs in rungs]
        self.ended: set[str] = set()

    def rung_at(self, epochs: int) -> int | None:
        """The position of the rung at `epochs`, or None."""
        return next((i for i, rung in enumerate(self.rungs) if rung.epochs == epochs), None)

    def expected(self, i: int) -> set[str]:
        """The models that rung `i` waits for (once the rung below has decided)."""
        pool = self.models if i == 0 else self.rungs[i - 1].promoted()
        return {model for model in pool if model not in self.ended}

    def may_report(self, model: str, i: int) -> bool:
        """Whether `model` reaching rung `i` now is a report the rung waits for."""
        below_decided = i == 0 or all(m in self.rungs[i - 1].verdicts for m in self.rungs[i - 1].reports)
        return below_decided and model in self.expected(i) and model not in self.rungs[i].reports

    def due(self, reduction: float) -> tuple[int, list[Due]]:
        """The lowest rung that has all its models and lacks some verdicts: its epochs and
        the verdicts it lacks (none: (0, []))."""
        for i, rung in enumerate(self.rungs):
            if not self.expected(i) <= rung.reports.keys():
                break
            missing = [d for d in rung.ranked(reduction) if d[0] not in rung.verdicts]
            if missing:
                return rung.epochs, missing
        return 0, []

    def waiting(self) -> set[str]:
        """The models paused at a rung without a verdict yet."""
        return {m for rung in self.rungs for m in rung.reports if m not in rung.verdicts}

    def withdraw(self, model: str) -> None:
        """`model` ended on its own: not waited for, and its undecided report is void."""
        self.ended.add(model)
        for rung in self.rungs:
            if model in rung.reports and model not in rung.verdicts:
                del rung.reports[model]


class SuccessiveHalving(EarlyStopping):
    """Synchronous successive halving: pause at each rung, promote the top 1/η once it fills."""

    verdicts = frozenset({Verdict.PAUSED, Verdict.PROMOTED, Verdict.STOPPED})

    def __init__(self, settings: EarlyStopSettings, models: Sequence[str], cohorts: Mapping[str, str] | None = None):
        super().__init__(settings, models, cohorts)
        self._brackets = [bracket for members in self.cohorts() for bracket in self._make_brackets(members)]
        self._of = {model: bracket for bracket in self._brackets for model in bracket.models}

    def _make_brackets(self, models: tuple[str, ...]) -> list[_Bracket]:
        """The brackets of one cohort's `models` (spec order)."""
        s = self.settings
        return [_Bracket(0, models, rung_epochs(s.min_epochs, s.reduction, s.max_epochs))]

    def bracket(self, model: str) -> int:
        return self._of[self._model(model)].index

    def paused(self) -> list[str]:
        waiting = set().union(*(bracket.waiting() for bracket in self._brackets))
        return [model for model in self.models if model in waiting]

    def _rungs_of(self, model: str) -> tuple[int, ...]:
        return tuple(rung.epochs for rung in self._of[model].rungs)

    def _observe(self, model: str, epoch: int, value: float | None) -> None:
        bracket = self._of[model]
        i = bracket.rung_at(epoch)
        if i is None or not bracket.may_report(model, i):
            return
        self._decide(model, epoch, Verdict.PAUSED, value, None, bracket.index)
        self._promote(bracket)

    def _withdraw(self, model: str) -> None:
        bracket = self._of[model]
        bracket.withdraw(model)
        self._promote(bracket)

    def _settle(self) -> None:
        for bracket in self._brackets:
            self._promote(bracket)

    def _promote(self, bracket: _Bracket) -> None:
        """Decide every rung of `bracket` that has all its models, from the lowest up."""
        epochs, due = bracket.due(self.settings.reduction)
        while due:
            for model, verdict, value, cutoff in due:
                self._decide(model, epochs, verdict, value, cutoff, bracket.index)
            epochs, due = bracket.due(self.settings.reduction)

    def _check_record(self, record: RungDecision, place: int) -> None:
        """Besides the base's checks: a pause where the model could pause, a verdict about a
        model paused at that rung and not decided yet."""
        super()._check_record(record, place)
        bracket = self._of[record.model]
        i = bracket.rung_at(record.rung)
        if record.verdict is Verdict.PAUSED:
            if not bracket.may_report(record.model, i):
                raise RecordError("verdict", f"model {record.model!r} cannot pause at rung {record.rung} here")
        elif record.model not in bracket.rungs[i].reports or record.model in bracket.rungs[i].verdicts:
            raise RecordError("verdict", f"model {record.model!r} was not waiting at rung {record.rung}")

    def _apply(self, decision: RungDecision) -> None:
        super()._apply(decision)
        bracket = self._of[decision.model]
        rung = bracket.rungs[bracket.rung_at(decision.rung)]
        if decision.verdict is Verdict.PAUSED:
            rung.reports[decision.model] = decision.metric
        else:
            rung.verdicts[decision.model] = decision.verdict


class Hyperband(SuccessiveHalving):
    """Hyperband: brackets of successive halving with Li et al.'s sizes and first rungs."""

    def _make_brackets(self, models: tuple[str, ...]) -> list[_Bracket]:
        plans = hyperband_brackets(self.settings)
        dealt = deal(len(models), [plan.size for plan in plans])
        return [_Bracket(plan.index, [m for m, b in zip(models, dealt) if b == plan.index], plan.rungs)
                for plan in plans]
