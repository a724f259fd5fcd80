"""The early-stopping protocol: epochs in, rung decisions out; the state is the decisions.

A driver makes one :class:`EarlyStopping` per run (``create_early_stopping``) and calls it
where it records epochs:

1. ``epoch_ended(model, epoch, metric)`` once per epoch of every model, in the order the
   epochs happen, with the stop rule's metric made lower-is-better (``-val_accuracy`` or
   ``val_loss``). It returns the decisions made now -- possibly about other models too (a
   rung that fills promotes the models paused there). Where one call returns several
   decisions about a model, the last is the one that stands (``PAUSED`` then ``PROMOTED``).
2. ``model_ended(model, epochs)`` when the model's own stop rule ended it or it diverged:
   it is no longer waited for at a rung (which may fill the rung, so decisions may follow).
3. On a requeued job, on a fresh object: ``restore(records, ended, history)`` with the
   decisions recorded so far, the models that ended on their own, and (``median``) the
   epochs' metrics. It returns the decisions the recorded ones imply but that were not yet
   recorded (a job cut between writing two decisions of one rung).

With learning over groups, each model belongs to a *cohort* (its group): a rung then compares
the models of one cohort only, as if each cohort were a run of its own, while the decisions are
still numbered in one sequence for the whole run.

Every decision goes through one method, ``_apply``, whether it is made now or read back from
its record, so a restored object is in the very state of the one that made the records, and
the same later epochs give the same later decisions. Nothing is decided twice for a (model,
rung). Everything is deterministic: the same calls in the same order give the same decisions;
ties go to the model that reached the rung first.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from fleet.schedule.early_stop.decisions import RecordError, RungDecision, Verdict, finite_or_none

if TYPE_CHECKING:
    from fleet.schedule.early_stop.settings import EarlyStopSettings


class EarlyStopping:
    """Early stopping across the models of one run; a method fills the primitives below.

    Args:
        settings: the run's settings (its ``method`` chose the class).
        models: the models' ids in spec order.
        cohorts: each model's cohort (learning over groups: its group); a rung compares a
            model only with the models of its own cohort, and each cohort is decided as a run
            of its own would be. None, or a model not in it: one cohort of every such model.

    Primitives a method overrides: ``_rungs_of`` (a model's rungs), ``_observe`` (an epoch
    the model reached; decide through ``_decide``), ``_apply`` (what a decision changes),
    ``_withdraw`` (a model ended on its own), ``_settle`` (decisions due once restored),
    ``_remember`` (an epoch's metric read back on restore). ``verdicts`` lists the verdicts
    the method gives; ``paused`` and ``bracket`` have answers for methods without either.
    """

    verdicts: frozenset[Verdict] = frozenset()

    def __init__(self, settings: EarlyStopSettings, models: Sequence[str], cohorts: Mapping[str, str] | None = None):
        self.settings = settings
        self.models = _checked_models(models)
        self._known = frozenset(self.models)
        self._cohort_of = {model: (cohorts or {}).get(model) for model in self.models}
        self._decisions: list[RungDecision] = []
        self._stopped: set[str] = set()
        self._ended: dict[str, int] = {}

    # -- the protocol ---------------------------------------------------------------------

    @property
    def decisions(self) -> tuple[RungDecision, ...]:
        """Every decision so far (restored ones included), in ``seq`` order."""
        return tuple(self._decisions)

    def rungs(self, model: str) -> tuple[int, ...]:
        """The epochs at which `model` meets a rung, ascending, all below ``max_epochs``."""
        return self._rungs_of(self._model(model))

    def next_stop(self, model: str, epochs_done: int) -> int | None:
        """The epochs at which `model`'s training may be cut next (its next rung), or None."""
        return next((rung for rung in self.rungs(model) if rung > epochs_done), None)

    def bracket(self, model: str) -> int:
        """`model`'s Hyperband bracket; 0 for the other methods."""
        self._model(model)
        return 0

    def epoch_ended(self, model: str, epoch: int, metric: float | None) -> list[RungDecision]:
        """`model` completed `epoch` (counted from 1) with `metric` (lower is better).

        Returns:
            The decisions made now, in ``seq`` order. None for a model that was stopped or
            ended, or for a (model, rung) decided already (an epoch trained again after a
            requeue).
        """
        self._model(model)
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 1:
            raise ValueError(f"epoch: expected an integer >= 1, got {epoch!r}")
        if model in self._stopped or model in self._ended:
            return []
        return self._made(lambda: self._observe(model, epoch, finite_or_none(metric)))

    def model_ended(self, model: str, epochs: int) -> list[RungDecision]:
        """`model`'s own stop rule ended it after `epochs`, or it diverged.

        Returns:
            The decisions this makes due (a rung that waited only for `model` fills).
        """
        self._model(model)
        if model in self._stopped or model in self._ended:
            return []
        self._ended[model] = epochs
        return self._made(lambda: self._withdraw(model))

    def restore(self, records: Iterable[RungDecision], ended: Mapping[str, int] | None = None,
                history: Iterable[tuple[str, int, float | None]] = ()) -> list[RungDecision]:
        """Rebuild the state of a run from what it recorded (a fresh object only).

        Args:
            records: the decisions recorded, in any order (``seq`` orders them: 0, 1, ...).
            ended: the models that ended on their own (stop rule, divergence), with their
                epochs; needed wherever a rung may still wait for them.
            history: (model, epoch, metric) of the epochs completed, in the order they came
                (``median`` compares with them; the other methods ignore them).

        Returns:
            The decisions due that the records lack; the caller records them and acts.

        Raises:
            RecordError: a record that does not fit this run (naming the field).
        """
        if self._decisions or self._ended:
            raise ValueError("restore: only a fresh early-stopping object can be restored")
        for place, record in enumerate(sorted(records, key=lambda r: r.seq)):
            self._check_record(record, place)
            self._decisions.append(record)
            self._apply(record)
        for model, epoch, metric in history:
            self._remember(self._model(model), epoch, finite_or_none(metric))
        made = [decision for model, epochs in (ended or {}).items() for decision in self.model_ended(model, epochs)]
        return made + self._made(self._settle)

    def paused(self) -> list[str]:
        """The models waiting at a rung to be promoted or stopped, in spec order."""
        return []

    def stopped(self) -> list[str]:
        """The models early stopping has stopped, in spec order."""
        return [model for model in self.models if model in self._stopped]

    def is_stopped(self, model: str) -> bool:
        """Whether early stopping has stopped `model`."""
        return model in self._stopped

    # -- for the methods ------------------------------------------------------------------

    def cohort(self, model: str) -> str | None:
        """The cohort `model` is compared within (None: the one cohort of models without one)."""
        return self._cohort_of[model]

    def cohorts(self) -> list[tuple[str, ...]]:
        """The models of each cohort, in spec order, cohorts by their first model."""
        members: dict[str | None, list[str]] = {}
        for model in self.models:
            members.setdefault(self._cohort_of[model], []).append(model)
        return [tuple(models) for models in members.values()]

    def _decide(self, model: str, rung: int, verdict: Verdict, metric: float | None, cutoff: float | None,
                bracket: int = 0) -> RungDecision:
        """Make a decision: it takes the next ``seq`` and changes the state (``_apply``)."""
        decision = RungDecision(model=model, rung=rung, verdict=verdict, metric=metric, cutoff=cutoff,
                                bracket=bracket, seq=len(self._decisions))
        self._decisions.append(decision)
        self._apply(decision)
        return decision

    def _apply(self, decision: RungDecision) -> None:
        """What `decision` changes (the base: a stopped model is stopped)."""
        if decision.verdict is Verdict.STOPPED:
            self._stopped.add(decision.model)

    def _rungs_of(self, model: str) -> tuple[int, ...]:
        return ()

    def _observe(self, model: str, epoch: int, value: float | None) -> None:
        """`model` (neither stopped nor ended) reached `epoch` with `value`."""

    def _withdraw(self, model: str) -> None:
        """`model` ended on its own (already in ``_ended``)."""

    def _settle(self) -> None:
        """Make the decisions due once restored (a rung that filled before the job stopped)."""

    def _remember(self, model: str, epoch: int, value: float | None) -> None:
        """An epoch's metric from before a restore: kept, not decided on."""

    def _model(self, model: str) -> str:
        if model not in self._known:
            raise KeyError(f"model {model!r} is not in the ensemble")
        return model

    def _made(self, act: Callable[[], object]) -> list[RungDecision]:
        """The decisions `act` makes."""
        before = len(self._decisions)
        act()
        return self._decisions[before:]

    def _check_record(self, record: RungDecision, place: int) -> None:
        """A restored record must fit this run: its place, its model, rung, bracket, verdict."""
        if record.seq != place:
            raise RecordError("seq", f"expected {place} (the records number 0, 1, ... without gaps), got {record.seq}")
        if record.model not in self._known:
            raise RecordError("model", f"{record.model!r} is not in the ensemble")
        if record.model in self._stopped:
            raise RecordError("model", f"{record.model!r} was stopped by an earlier record")
        if record.verdict not in self.verdicts:
            raise RecordError("verdict", f"{record.verdict.value!r} is no decision of method {self.settings.method!r}")
        if record.rung not in self._rungs_of(record.model):
            raise RecordError("rung", f"{record.rung} is no rung of model {record.model!r}")
        if record.bracket != self.bracket(record.model):
            raise RecordError("bracket", f"model {record.model!r} is in bracket {self.bracket(record.model)}, "
                                         f"not {record.bracket}")


class NoEarlyStopping(EarlyStopping):
    """Method ``none``: every model trains until its own stop rule ends it."""


def _checked_models(models: Sequence[str]) -> tuple[str, ...]:
    out = tuple(models)
    if any(not isinstance(m, str) or not m for m in out):
        raise ValueError("models: expected model ids (non-empty strings)")
    if len(set(out)) != len(out):
        raise ValueError("models: an id is listed twice")
    return out
