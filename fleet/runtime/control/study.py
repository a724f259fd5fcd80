"""One adaptive search's Optuna study, asked and told one model at a time.

The study lives in the run directory (``search/<study>.journal``, Optuna's journal-file
storage: no database server, safe on a shared file system), so a requeued job continues it.
`Study.ask` reuses a trial asked but never claimed by a model (the job died between the ask and
its record) before asking a new one, so a trial is never asked twice. What the search space
becomes in Optuna (`distributions`): a ``choice`` a categorical (items that are not plain
values, such as lists, by their JSON text), ``uniform`` / ``loguniform`` a float (log-scaled),
``int`` an int, and ``int`` with ``size: k`` k ints ``key[0]`` ... ``key[k-1]``, put back
together as a list (`values_of`).

Under early stopping a model-based sampler sees the models that looked best at the first rungs
complete and the rest pruned, and a sampler that trusts those verdicts keeps asking for what
learns fastest early, not what ends best. As BOHB does, a fixed share of the trials
(`RANDOM_SHARE`, BOHB's rho) is then drawn at random over the space, decided per trial number
from the seed, so the search keeps exploring what the rungs cut short.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState

from fleet.errors import UserError
from fleet.spec.search import Dimension, missing_package

PLAIN = (str, int, float, bool, type(None))
RANDOM_SHARE = 1 / 3
"""The share of trials drawn at random where early stopping prunes models (BOHB's default rho)."""


def _tpe(seed: int) -> optuna.samplers.BaseSampler:
    # running models are pending trials: the constant liar keeps TPE from asking their like again
    return optuna.samplers.TPESampler(seed=seed, constant_liar=True)


SAMPLERS: dict[str, Callable[[int], optuna.samplers.BaseSampler]] = {
    "tpe": _tpe,
    "cmaes": lambda seed: optuna.samplers.CmaEsSampler(seed=seed),
    "gp": lambda seed: optuna.samplers.GPSampler(seed=seed),
    "qmc": lambda seed: optuna.samplers.QMCSampler(seed=seed),
}
"""Each adaptive sampler's maker, from a seed (the packages each needs: `SAMPLER_PACKAGES`)."""


def _categorical(choices: list[Any]) -> CategoricalDistribution:
    plain = all(isinstance(c, PLAIN) for c in choices)
    return CategoricalDistribution(choices if plain else [json.dumps(c) for c in choices])


def distributions(space: dict[str, Dimension]) -> dict[str, BaseDistribution]:
    """Optuna's distributions of `space` (see the module docstring)."""
    out: dict[str, BaseDistribution] = {}
    for key, dim in space.items():
        if dim.choice is not None:
            out[key] = _categorical(dim.choice)
        elif dim.uniform is not None or dim.loguniform is not None:
            low, high = dim.uniform or dim.loguniform  # type: ignore[misc]
            out[key] = FloatDistribution(low, high, log=dim.loguniform is not None)
        elif dim.size is None:
            out[key] = IntDistribution(*dim.int_range)  # type: ignore[misc]
        else:
            out.update({f"{key}[{k}]": IntDistribution(*dim.int_range) for k in range(dim.size)})  # type: ignore[misc]
    return out


def values_of(space: dict[str, Dimension], params: dict[str, Any]) -> dict[str, Any]:
    """A trial's params as the model's searched values (the inverse of `distributions`)."""
    out: dict[str, Any] = {}
    for key, dim in space.items():
        if dim.choice is not None:
            plain = all(isinstance(c, PLAIN) for c in dim.choice)
            out[key] = params[key] if plain else json.loads(params[key])
        elif dim.size is not None:
            out[key] = [int(params[f"{key}[{k}]"]) for k in range(dim.size)]
        else:
            out[key] = params[key]
    return out


def drawn_at_random(seed: int, number: int, share: float) -> bool:
    """Whether trial `number` of a study seeded `seed` is drawn at random (`share` of them)."""
    return share > 0 and zlib.crc32(f"{seed}:random:{number}".encode()) / 2**32 < share


def random_params(fixed: dict[str, BaseDistribution], seed: int, number: int) -> dict[str, Any]:
    """Trial `number`'s params drawn uniformly over `fixed` (log-uniform where log-scaled)."""
    sampler = optuna.samplers.RandomSampler(seed=zlib.crc32(f"{seed}:params:{number}".encode()) & 0x7FFFFFFF)
    return {name: sampler.sample_independent(None, None, name, dist) for name, dist in fixed.items()}  # type: ignore[arg-type]


class Study:
    """One adaptive search's study (see the module docstring).

    Args:
        folder: where its journal lives (the run directory's ``search/``).
        name: the study's name (the search's id prefix), which names the journal.
        sampler: a name of `SAMPLERS`.
        space: the searched dimensions.
        maximize: whether a larger metric is better (``val_accuracy``).
        seed: the sampler's seed.
        random_share: the share of trials drawn at random instead of by the sampler (see
            the module docstring), in [0, 1).

    Raises:
        UserError: the sampler needs a package that is not installed.
    """

    def __init__(self, folder: str | Path, name: str, sampler: str, space: dict[str, Dimension], maximize: bool,
                 seed: int, random_share: float = 0.0):
        missing = missing_package(sampler)
        if missing is not None:
            raise UserError(f"sampler {sampler}: needs the package {missing} (pip install {missing})")
        Path(folder).mkdir(parents=True, exist_ok=True)
        self.path = Path(folder) / f"{name}.journal"
        storage = JournalStorage(JournalFileBackend(str(self.path)))
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.space, self.seed, self.random_share = space, seed, random_share
        self.study = optuna.create_study(
            study_name=name, storage=storage, sampler=SAMPLERS[sampler](seed), load_if_exists=True,
            direction="maximize" if maximize else "minimize")
        asked = len(self.study.get_trials(deepcopy=False))
        if asked:  # a resumed study: a sampler seeded as the first job's would repeat its first draws
            self.study.sampler = SAMPLERS[sampler](zlib.crc32(f"{seed}:{asked}".encode()) & 0x7FFFFFFF)

    def ask(self, claimed: Collection[int]) -> tuple[int, dict[str, Any]]:
        """A trial for a new model: the lowest running trial not in `claimed` (asked before a
        crash, never recorded), else a new one; its number and the model's searched values."""
        trials = self.study.get_trials(deepcopy=False)
        for trial in trials:
            if trial.state is TrialState.RUNNING and trial.number not in claimed:
                return trial.number, values_of(self.space, trial.params)
        fixed = distributions(self.space)
        waiting = any(t.state is TrialState.WAITING for t in trials)  # drawn at random before a crash
        if not waiting and drawn_at_random(self.seed, len(trials), self.random_share):
            self.study.enqueue_trial(random_params(fixed, self.seed, len(trials)))
        trial = self.study.ask(fixed_distributions=fixed)
        return trial.number, values_of(self.space, trial.params)

    def tell(self, number: int, value: float | None) -> None:
        """Trial `number` ended with `value` (None or not finite: failed)."""
        if self._finished(number):
            return
        if value is None or value != value or value in (float("inf"), float("-inf")):
            self.study.tell(number, state=TrialState.FAIL)
        else:
            self.study.tell(number, value)

    def prune(self, number: int, value: float | None, step: int) -> None:
        """Trial `number` was stopped early after `step` epochs, at `value` (reported as its
        intermediate value there, which Optuna takes as a pruned trial's value)."""
        if self._finished(number):
            return
        if value is not None:
            frozen = self.study.get_trials(deepcopy=False)[number]
            # a trial asked by an earlier job has no Trial object here: one over the same storage row
            optuna.trial.Trial(self.study, frozen._trial_id).report(value, step)
        self.study.tell(number, state=TrialState.PRUNED)

    def states(self) -> dict[int, TrialState]:
        """Every trial's state, by number."""
        return {t.number: t.state for t in self.study.get_trials(deepcopy=False)}

    def _finished(self, number: int) -> bool:
        return self.study.get_trials(deepcopy=False)[number].state.is_finished()
