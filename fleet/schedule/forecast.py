"""Re-estimating a model's remaining epochs while the run goes (pure; for the policies).

A policy plans with an *estimate* of each model's epochs to converge, which may be far off.
Two things sharpen it as models train:

* **How wrong the estimates are.** Every model that converges tells the ratio of its true
  epochs to its estimate. A model still training after ``d`` epochs has a ratio above
  ``d / estimate``; its remaining epochs are forecast from the ratios seen so far that are
  above that (a quantile of them: ``level`` 0.5 for the median, higher to plan for the risk
  of a short estimate). Until a few ratios are known, the estimate is taken as it is; a model
  past its estimate (or past every ratio seen) is assumed to need one more epoch at a time.
* **Its own learning curve.** Where epochs report the validation metric the stop rule watches
  (lower is better: a loss; an accuracy is negated), the curve so far is fitted with
  ``a + b * exp(-k / tau)`` and the model is forecast to stop at the first epoch whose fitted
  improvement falls below the improvement at which models that already converged stopped (the
  median of their own fits at their last epoch): the stop rule's ``min_delta`` and patience,
  learned rather than told. A curve that keeps improving is forecast to go on; one that
  flattens, to stop.
* **Which of the two to believe.** Every converged model scores both against the epochs it
  really took: the curve's forecast at each of its epochs, and its estimate at the same epochs
  (the median of the absolute log errors, per model). The curve's forecast is used where it
  has one, unless the estimates have proven much better: once ``_MIN_SCORED`` models are
  scored, their typical error (the median over the models) under ``_ESTIMATE_TRUSTED`` times
  the curve's. Near-exact estimates are then not traded for a noisier curve (exact estimates
  with curves, 160 GPUs: 1.066 x LB2 instead of 1.096; bench/HISTORY.md); with estimates off
  by +-20 % or more the curve serves better, even where its errors are about as large (they
  shrink as the curve grows; an estimate's do not).

:func:`stop_epoch` is the curve part on its own, for tests and tools.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

_MIN_RATIOS = 3  # converged models needed before their ratios are trusted
_MIN_CURVE = 4  # epochs of a curve needed before it is fitted
_ESTIMATE_TRUSTED = 0.5  # estimates replace the curve once their typical error is below this share of its
_MIN_SCORED = 12  # models scored before that (fewer: a few lucky estimates would decide)
_TAUS = np.geomspace(0.5, 400.0, 48)  # time constants (epochs) the curve fit tries
_HORIZON = 10_000  # epochs past which a curve is taken to never flatten


@dataclass(frozen=True)
class CurveFit:
    """``value(k) = a + b * exp(-k / tau)`` fitted to a validation curve (``k`` = epoch, from 1)."""

    a: float
    b: float
    tau: float

    def gain(self, epoch: float) -> float:
        """Fitted improvement of the epoch after ``epoch`` (``value(epoch) - value(epoch + 1)``)."""
        return self.b * math.exp(-epoch / self.tau) * (1.0 - math.exp(-1.0 / self.tau))

    def first_epoch_below(self, gain: float, start: int) -> float:
        """First epoch ``>= start`` whose fitted improvement is below ``gain`` (``inf`` if never)."""
        if self.b <= 0 or gain <= 0:
            return float(start) if self.b <= 0 else math.inf
        step = 1.0 - math.exp(-1.0 / self.tau)
        epoch = self.tau * math.log(self.b * step / gain)
        return float(max(start, math.ceil(epoch))) if epoch < _HORIZON else math.inf


def fit_curve(values: Sequence[float]) -> CurveFit | None:
    """Least-squares ``a + b exp(-k/tau)`` over a grid of ``tau`` (None: too short to fit)."""
    y = np.asarray(values, dtype=float)
    if y.size < _MIN_CURVE or not np.all(np.isfinite(y)):
        return None
    k = np.arange(1, y.size + 1, dtype=float)
    basis = np.exp(-k[None, :] / _TAUS[:, None])  # one row per tau
    centred = basis - basis.mean(axis=1, keepdims=True)
    spread = np.einsum("ij,ij->i", centred, centred)
    slope = centred @ (y - y.mean()) / np.maximum(spread, 1e-300)
    residual = np.sum((y - y.mean()) ** 2) - slope * (centred @ (y - y.mean()))
    best = int(np.argmin(np.where(spread > 1e-12, residual, np.inf)))
    b = float(slope[best])
    return CurveFit(float(y.mean() - b * basis[best].mean()), b, float(_TAUS[best]))


def stop_epoch(values: Sequence[float], stop_gain: float) -> float | None:
    """Forecast epoch at which a curve of ``values`` (lower is better) stops: the first epoch
    from now on whose fitted improvement is below ``stop_gain``; ``inf`` for a curve that keeps
    improving; None when the curve is too short to fit."""
    fit = fit_curve(values)
    if fit is None:
        return None
    return fit.first_epoch_below(stop_gain, len(values))


def _quantile(ordered: Sequence[float], first: int, level: float) -> float:
    """The ``level`` quantile of ``ordered[first:]`` (ascending), interpolated as numpy's default."""
    position = first + level * (len(ordered) - 1 - first)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _forecast_by_ratios(ratios: np.ndarray, estimates: np.ndarray, done: np.ndarray, level: float) -> np.ndarray:
    """`EpochForecast.remaining` by the ratios seen (sorted), vectorised: the ``level`` quantile of
    the ratios above each model's ``done / estimate``, times its estimate, less ``done``; 1 past
    every ratio seen, and at least 1."""
    first = np.searchsorted(ratios, done / estimates, side="right")
    beyond = first == ratios.size
    first = np.minimum(first, ratios.size - 1)
    position = first + level * (ratios.size - 1 - first)
    low = np.floor(position).astype(int)
    high = np.minimum(low + 1, ratios.size - 1)
    quantile = ratios[low] + (ratios[high] - ratios[low]) * (position - low)
    return np.where(beyond, 1.0, np.maximum(quantile * estimates - done, 1.0))


class EpochForecast:
    """Remaining epochs per model, sharpened by converged models and learning curves.

    Mutable, owned by one policy; fed with :meth:`observe_epoch` and :meth:`observe_converged`.
    """

    def __init__(self) -> None:
        self.ratios: list[float] = []  # true / estimated epochs of converged models, sorted
        self.stop_gains: list[float] = []  # fitted improvement of converged curves at their end
        self.curves: dict[str, list[float]] = {}
        self.fits: dict[str, CurveFit] = {}  # each curve's latest fit
        self.fit_history: dict[str, list[tuple[int, CurveFit]]] = {}  # (epochs fitted, fit) per model
        self.errors: tuple[list[float], list[float]] = ([], [])  # per scored model: curve's, estimate's
        self.curve_trusted = True

    def observe_epoch(self, model: str, epoch: int, metric: float | None) -> None:
        """A model finished ``epoch`` with validation ``metric`` (lower is better; None: unknown)."""
        if metric is None or not math.isfinite(metric):
            return
        curve = self.curves.setdefault(model, [])
        del curve[epoch - 1:]
        history = self.fit_history.setdefault(model, [])
        history[:] = [(fitted, fit) for fitted, fit in history if fitted < epoch]
        if len(curve) == epoch - 1:
            curve.append(float(metric))
        fit = fit_curve(curve)
        if fit is not None:
            self.fits[model] = fit
            history.append((len(curve), fit))
        else:
            self.fits.pop(model, None)

    def observe_converged(self, model: str, estimate: float, epochs: int, metric: float | None = None) -> None:
        """A model converged after ``epochs`` against an estimate of ``estimate``."""
        self.observe_epoch(model, epochs, metric)
        self._score(self.fit_history.pop(model, []), estimate, epochs)
        if estimate > 0:
            bisect.insort(self.ratios, epochs / estimate)
        fit = self.fits.pop(model, None)
        if fit is not None:
            gain = fit.gain(epochs)
            bisect.insort(self.stop_gains, gain)
        self.curves.pop(model, None)

    def remaining(self, model: str, estimate: float, done: float, level: float = 0.5) -> float:
        """Forecast epochs ``model`` still needs (at least one) after ``done`` of them."""
        by_curve = self._by_curve(model, done) if self.curve_trusted else None
        if by_curve is not None:
            return max(by_curve - done, 1.0)
        if len(self.ratios) < _MIN_RATIOS or estimate <= 0:
            return max(estimate - done, 1.0)
        first = bisect.bisect_right(self.ratios, done / estimate)
        if first == len(self.ratios):  # past every ratio seen
            return 1.0
        return max(_quantile(self.ratios, first, level) * estimate - done, 1.0)

    def remaining_of(self, models: Sequence[str], estimates: np.ndarray, done: np.ndarray,
                     level: float = 0.5) -> np.ndarray:
        """`remaining` of many models at once (the same floats): the running models of a
        10,000-GPU job are all forecast after every convergence."""
        out = np.maximum(estimates - done, 1.0)
        if len(self.ratios) >= _MIN_RATIOS:
            judged = estimates > 0
            out[judged] = _forecast_by_ratios(np.array(self.ratios), estimates[judged], done[judged], level)
        if self.curve_trusted and self.fits:
            for k, model in enumerate(models):
                if model in self.fits:
                    out[k] = self.remaining(model, float(estimates[k]), float(done[k]), level)
        return out

    def _by_curve(self, model: str, done: float) -> float | None:
        fit = self.fits.get(model)
        if fit is None or len(self.stop_gains) < _MIN_RATIOS or len(self.curves[model]) + 1e-9 < done:
            return None
        forecast = fit.first_epoch_below(self._stop_gain(), len(self.curves[model]))
        return None if math.isinf(forecast) else forecast

    def _stop_gain(self) -> float:
        return self.stop_gains[len(self.stop_gains) // 2]

    def _score(self, history: list[tuple[int, CurveFit]], estimate: float, epochs: int) -> None:
        """Score a converged model's curve forecasts (at each epoch where it gave one: a curve that
        never flattens gives none) and its estimate at the same epochs against its ``epochs``."""
        if len(self.stop_gains) < _MIN_RATIOS or estimate <= 0 or epochs <= 0:
            return
        gain = self._stop_gain()
        forecasts = [(fitted, fit.first_epoch_below(gain, fitted)) for fitted, fit in history if fitted < epochs]
        forecasts = [(fitted, forecast) for fitted, forecast in forecasts if not math.isinf(forecast)]
        if not forecasts:
            return

        def error(guess: float, fitted: int) -> float:
            return abs(math.log(max(guess, fitted + 1.0) / epochs))

        self.errors[0].append(float(np.median([error(forecast, fitted) for fitted, forecast in forecasts])))
        self.errors[1].append(float(np.median([error(estimate, fitted) for fitted, _ in forecasts])))
        curve, guess = (float(np.median(e)) for e in self.errors)
        self.curve_trusted = len(self.errors[0]) < _MIN_SCORED or guess >= _ESTIMATE_TRUSTED * curve
