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


class EpochForecast:
    """Remaining epochs per model, sharpened by converged models and learning curves.

    Mutable, owned by one policy; fed with :meth:`observe_epoch` and :meth:`observe_converged`.
    """

    def __init__(self) -> None:
        self.ratios: list[float] = []  # true / estimated epochs of converged models, sorted
        self.stop_gains: list[float] = []  # fitted improvement of converged curves at their end
        self.curves: dict[str, list[float]] = {}
        self.fits: dict[str, CurveFit] = {}  # each curve's latest fit

    def observe_epoch(self, model: str, epoch: int, metric: float | None) -> None:
        """A model finished ``epoch`` with validation ``metric`` (lower is better; None: unknown)."""
        if metric is None or not math.isfinite(metric):
            return
        curve = self.curves.setdefault(model, [])
        del curve[epoch - 1:]
        if len(curve) == epoch - 1:
            curve.append(float(metric))
        fit = fit_curve(curve)
        if fit is not None:
            self.fits[model] = fit
        else:
            self.fits.pop(model, None)

    def observe_converged(self, model: str, estimate: float, epochs: int, metric: float | None = None) -> None:
        """A model converged after ``epochs`` against an estimate of ``estimate``."""
        self.observe_epoch(model, epochs, metric)
        if estimate > 0:
            bisect.insort(self.ratios, epochs / estimate)
        fit = self.fits.pop(model, None)
        if fit is not None:
            gain = fit.gain(epochs)
            bisect.insort(self.stop_gains, gain)
        self.curves.pop(model, None)

    def remaining(self, model: str, estimate: float, done: float, level: float = 0.5) -> float:
        """Forecast epochs ``model`` still needs (at least one) after ``done`` of them."""
        by_curve = self._by_curve(model, done)
        if by_curve is not None:
            return max(by_curve - done, 1.0)
        if len(self.ratios) < _MIN_RATIOS or estimate <= 0:
            return max(estimate - done, 1.0)
        first = bisect.bisect_right(self.ratios, done / estimate)
        if first == len(self.ratios):  # past every ratio seen
            return 1.0
        return max(_quantile(self.ratios, first, level) * estimate - done, 1.0)

    def _by_curve(self, model: str, done: float) -> float | None:
        fit = self.fits.get(model)
        if fit is None or len(self.stop_gains) < _MIN_RATIOS or len(self.curves[model]) + 1e-9 < done:
            return None
        forecast = fit.first_epoch_below(self.stop_gains[len(self.stop_gains) // 2], len(self.curves[model]))
        return None if math.isinf(forecast) else forecast
