"""fleet-adaptive's plan of the models: what each is planned for, and in what order it waits.

Steps 1 and 2 of `fleet.schedule.planners.adaptive`, and what the run teaches about them: the
rate table (no faster than decoding; each model's curve rescaled by the ratio of its measured
to its profiled rate after every epoch), the target makespan (``target_factor`` times the
malleable bound on the estimated work), each model's planned GPU count (the fewest useful
count whose estimated time fits the target, or the bound itself for a model whose fastest time
is near it: `planned_count`), the LPT queue, and the forecast of each model's
remaining epochs (`fleet.schedule.forecast.EpochForecast`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fleet.schedule._base import ClusterView, EpochCompleted, ModelConverged, ModelView
from fleet.schedule.bounds import malleable_bound
from fleet.schedule.flotilla import useful_counts
from fleet.schedule.forecast import EpochForecast

# A model whose fastest time is over this share of the bound is planned to finish by the bound
# (`planned_count`). Tuned on the workload family's TUNING_SEEDS (0.5: 23 -> 28 of its 32 cells
# within 1.10 mean / 1.15 worst x LB2, beside 1 / target_factor; 0.4 and 0.25 also widened
# paper100's long models at 140-160 GPUs, where they lose more than they gain).
NEAR_BOUND = 0.5


class ModelPlan:
    """The plan fleet-adaptive keeps of every model; see the module docstring.

    Args:
        target_factor: plan GPU counts for this many times the malleable bound.
        risk_level: the quantile of the forecast of remaining epochs planned for.

    Attributes:
        rates: ``rates[i, m-1]``: model ``i``'s planned rate on ``m`` GPUs (set by `plan`), up to
            the last count at which some model is faster than on fewer GPUs (`rate` gives any).
        factors: ``factors[i]``: the measured / profiled rate model ``i``'s row is rescaled by.
        fastest: ``fastest[i]``: the count at which model ``i`` is planned fastest (the first).
        version: counts the changes of ``rates`` (what was read from them before still holds
            while it stays the same).
        counts: model -> its planned GPU count.
        critical: the models whose fastest time is over ``NEAR_BOUND`` times the bound: planned
            to finish by it (`planned_count`), and never paced below that (`StreamMatcher.floor`).
        queue: the models waiting, longest estimated duration first.
        target: the target makespan, seconds.
        reference: the median model's single-GPU rate (slow streams are matched tighter).
        forecast: the forecast of each model's remaining epochs.
    """

    def __init__(self, target_factor: float, risk_level: float):
        self.target_factor, self.level = target_factor, risk_level
        self.rates: np.ndarray | None = None
        self.factors: np.ndarray | None = None
        self.fastest: np.ndarray | None = None
        self.version = 0
        self.counts: dict[str, int] = {}
        self.critical: set[str] = set()
        self.queue: list[str] = []
        self.target = 0.0
        self.reference = 0.0
        self.forecast = EpochForecast()
        self.table = None  # the rate table `rates` was read from

    def plan(self, view: ClusterView) -> None:
        """Target makespan, GPU count per model and the LPT queue."""
        total = view.total_gpus
        self.rates = capped(view, view.rates.useful_matrix(total).copy())
        self.table = view.rates
        self.factors = np.ones(len(view.models))
        self.version += 1
        self.fastest = np.argmax(self.rates, axis=1) + 1 if view.models else np.zeros(0, dtype=int)
        times = self.work(view)[:, None] / self.rates
        target = malleable_bound(times, total_gpus=total) * self.target_factor
        self.target = target
        ids = np.array([m.id for m in view.models], dtype=object)
        ties = np.empty(len(ids), dtype=int)
        ties[np.argsort(ids, kind="stable")] = np.arange(len(ids))
        counts, critical = planned_counts(times, useful_counts(self.rates), target, self.target_factor, total, ties)
        self.counts = {m.id: int(counts[i]) for i, m in enumerate(view.models)}
        self.critical = {view.models[i].id for i in np.flatnonzero(critical)}
        duration = {m.id: times[i, self.counts[m.id] - 1] for i, m in enumerate(view.models)}
        self.queue = sorted(duration, key=lambda m: (-duration[m], m))
        self.reference = float(np.median(self.rates[:, 0])) if view.models else 0.0  # none left: a resumed job

    def follow(self, view: ClusterView) -> None:
        """The view's rate table is another than `rates` was read from (an adaptive search's
        model estimated anew when asked, `Driver.rates_estimated`): the rows of the models
        whose rates changed are read again, as planned rates no longer rescaled by a measure."""
        if self.table is None or view.rates is self.table:
            return
        before, self.table = self.table, view.rates
        changed = [i for i, (old, new) in enumerate(zip(before.models, view.rates.models)) if old.rates != new.rates]
        if not changed:
            return
        width = self.rates.shape[1]
        for i in changed:
            profile = view.rates.models[i]
            self.factors[i] = 1.0
            self.rates[i] = capped(view, np.array([profile.rate(m, view.gpus_per_node) for m in range(1, width + 1)]))
            self.fastest[i] = np.argmax(self.rates[i]) + 1
        self.version += 1

    def observe_epoch(self, event: EpochCompleted, view: ClusterView) -> None:
        """Refine the model's rate curve by the ratio of measured to profiled rate, and its
        forecast of remaining epochs by the epoch's metric."""
        self.forecast.observe_epoch(event.model, event.epoch, event.metric)
        gpus = len(view.model(event.model).gpus)
        if self.rates is not None and event.samples_per_s > 0 and gpus:
            i = view.rates.index(event.model)
            factor = event.samples_per_s / view.rates.rate(event.model, gpus)
            if factor != self.factors[i]:  # else the row stays as it is
                self.factors[i] = factor
                self.rates[i] = capped(view, view.rates.useful_matrix(view.total_gpus)[i] * factor)
                self.fastest[i] = np.argmax(self.rates[i]) + 1
                self.version += 1

    def observe_converged(self, event: ModelConverged, view: ClusterView) -> None:
        """A converged model tells how far off its estimate was."""
        self.forecast.observe_converged(event.model, view.model(event.model).epochs_estimate, event.epochs)

    def work(self, view: ClusterView) -> np.ndarray:
        """Estimated samples each model still needs (at least one epoch)."""
        return self.remaining_of(view.models) * view.rates.samples_per_epoch

    def remaining_of(self, models: Sequence[ModelView]) -> np.ndarray:
        """`remaining` of each of `models`, at once."""
        done = np.array([m.epochs_done for m in models], dtype=float)
        forecast = self.forecast.remaining_of([m.id for m in models], np.array([m.epochs_estimate for m in models],
                                              dtype=float), done, self.level)
        stops = [(k, m.next_stop) for k, m in enumerate(models) if m.next_stop is not None]
        if stops:
            rows, at = (np.array(column) for column in zip(*stops))
            forecast[rows] = np.minimum(forecast[rows], np.maximum(1.0, (at - done[rows])))
        return forecast

    def remaining(self, model: ModelView) -> float:
        """Forecast epochs a model still needs (`EpochForecast`, at the plan's risk level), up to
        its next rung where early stopping may cut it there."""
        forecast = self.forecast.remaining(model.id, model.epochs_estimate, model.epochs_done, self.level)
        if model.next_stop is None:
            return forecast
        return min(forecast, max(1.0, float(model.next_stop - model.epochs_done)))

    def requeue(self, view: ClusterView, model: str) -> None:
        """Queue `model` again (promoted at a rung) before the first model it outlasts, by the
        time it is estimated to need at its planned GPU count."""
        n = view.rates.samples_per_epoch

        def duration(m: str) -> float:
            return self.remaining(view.model(m)) * n / self.rate(view, m, self.counts[m])

        mine = self.remaining(view.model(model)) * n / self.rate(view, model, self.counts[model])
        at = next((k for k, m in enumerate(self.queue) if duration(m) < mine), len(self.queue))
        self.queue.insert(at, model)

    def rate(self, view: ClusterView, model: str, gpus: int) -> float:
        """The model's planned rate on `gpus` GPUs (past the counts `rates` holds, where no model
        is faster than on fewer GPUs, from the profile, rescaled and capped as its row)."""
        i = view.rates.index(model)
        if gpus <= self.rates.shape[1]:
            return float(self.rates[i, gpus - 1])
        return float(capped(view, np.float64(view.rates.rate(model, gpus)) * self.factors[i]))

    def rates_at(self, view: ClusterView, models: list[str], counts: np.ndarray) -> np.ndarray:
        """``out[k, j]``: the planned rate of ``models[k]`` on ``counts[k, j]`` GPUs (`rate`)."""
        rows = np.array([view.rates.index(m) for m in models])
        width = self.rates.shape[1]
        out = self.rates[rows[:, None], np.minimum(counts, width) - 1]
        for k, j in zip(*np.nonzero(counts > width)):
            out[k, j] = self.rate(view, models[k], int(counts[k, j]))
        return out


def planned_counts(times: np.ndarray, useful: np.ndarray, target: float, target_factor: float,
                   total_gpus: int, ties: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Every model's `planned_count`, where the models widened start in the first wave: in the
    queue's order (longest planned duration first), a widened model whose count does not fit
    ``total_gpus`` beside the counts of the models before it is planned for the target again (it
    would start only once others finish, too late to finish by the bound wide: a plan that widens
    more models than the GPUs hold at once runs them one after the other, later than narrow).
    One at a time, the first in the queue first: planned narrow, it moves up the queue.

    Args:
        times: ``times[i, m-1]``: model ``i``'s estimated time on ``m`` GPUs.
        useful: ``useful[i, m-1]``: whether ``m`` GPUs are faster for model ``i`` than fewer.
        target, target_factor: as `planned_count`'s.
        total_gpus: the GPUs of the job.
        ties: ``ties[i]``: model ``i``'s place among models of equal duration in the queue (its
            id's rank; default its row).

    Returns:
        The counts, and per model whether it is critical: its fastest time over ``NEAR_BOUND``
        times the bound and its count not planned for the target again.
    """
    rows = np.arange(times.shape[0])
    ties = rows if ties is None else ties
    narrow = np.array([_fewest_within(times[i], useful[i], target) for i in rows], dtype=int)
    counts = np.array([planned_count(times[i], useful[i], target, target_factor) for i in rows], dtype=int)
    widened = counts != narrow
    narrowed = np.zeros(rows.size, dtype=bool)
    while widened.any():
        order = np.lexsort((ties, -times[rows, counts - 1]))
        late = widened[order] & (np.cumsum(counts[order]) > total_gpus)
        if not late.any():
            break
        i = order[np.argmax(late)]
        counts[i], widened[i], narrowed[i] = narrow[i], False, True
    fastest = times.min(axis=1) if rows.size else np.zeros(0)
    return counts, (fastest > NEAR_BOUND * target / target_factor) & ~narrowed


def planned_count(times: np.ndarray, useful: np.ndarray, target: float, target_factor: float) -> int:
    """A model's planned GPU count: the fewest useful count whose time fits ``target``, or, for a
    model whose time there is over the bound (``target / target_factor``) and whose fastest time
    is over ``NEAR_BOUND`` times the bound, the fewest useful count that finishes by the bound
    itself: planned for the target, such a model starts too narrow and, once the queue is empty,
    the tail widens it too late and too wide (poor scalers waste the GPU-seconds).

    Args:
        times: ``times[m-1]``: the model's estimated time on ``m`` GPUs (every useful count).
        useful: ``useful[m-1]``: whether ``m`` GPUs are faster than every smaller count.
        target: the target makespan.
        target_factor: the target over the bound.

    Returns:
        The count (its fastest where none fits).
    """
    count = _fewest_within(times, useful, target)
    bound = target / target_factor
    if times[count - 1] > bound and times.min() > NEAR_BOUND * bound:
        return _fewest_within(times, useful, bound)
    return count


def _fewest_within(times: np.ndarray, useful: np.ndarray, limit: float) -> int:
    """The fewest useful count whose time is within ``limit`` (the fastest where none is)."""
    fits = np.flatnonzero(useful & (times <= limit * (1 + 1e-9)))
    return int(fits[0]) + 1 if fits.size else int(np.argmin(times)) + 1


def capped(view: ClusterView, rates: np.ndarray) -> np.ndarray:
    """Rates no faster than decoding, where the view knows its throughput."""
    return rates if view.decode_rate is None else np.minimum(rates, view.decode_rate)
