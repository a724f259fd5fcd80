"""Noise models for the simulator: how wrong the epoch estimates are, and what shows it.

A policy plans with estimated epochs; the simulator knows the truth (see
:mod:`fleet.schedule.simulator`). Two models of the difference:

``uniform``
    Each estimate is the true epochs times an independent ``U(1 - x, 1 + x)`` factor
    (:func:`~fleet.schedule.workloads.noisy_estimates`). Epochs report no metric: a policy
    learns a model's truth only when it converges (or outlives its estimate).
``stop-rule``
    Each model has a learning curve, its validation loss after epoch ``k``::

        loss(k) = floor + amp * exp(-k / tau) + N(0, sigma)

    and its true epochs are where the stop rule fires on that curve: no improvement by more
    than ``min_delta`` for ``patience`` epochs (the runtime's rule, on a loss). ``tau`` is
    drawn so that the noise-free curve stops at the workload's epochs; the noise moves the
    stop by a few epochs either way, as on a real curve. The estimate is the truth times
    ``U(1 - x, 1 + x)`` as in ``uniform``, but every epoch reports its loss
    (`EpochCompleted.metric`), so a policy can watch a curve flatten while the model trains.

Both are seeded: a (workload, seed, spread) gives the same scenario every time.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from fleet.schedule.scenario import Scenario
from fleet.schedule.workloads import Workload, noisy_estimates

NOISE_MODELS = ("uniform", "stop-rule")
"""Names of the noise models, for ``fleet simulate --noise-model``."""

PATIENCE = 3
MIN_DELTA = 0.01
SIGMA = 0.003


def stop_rule_epoch(values: Sequence[float], patience: int = PATIENCE, min_delta: float = MIN_DELTA) -> int | None:
    """The epoch (from 1) at which the stop rule fires on a loss curve; None if it never does."""
    best, stale = math.inf, 0
    for epoch, value in enumerate(values, start=1):
        if best - value > min_delta or epoch == 1:
            best, stale = value, 0
        else:
            stale += 1
        if stale >= patience:
            return epoch
    return None


def curve_tau(epochs: int, amp: float, patience: int = PATIENCE, min_delta: float = MIN_DELTA) -> float:
    """The smallest time constant with which a noise-free curve ``amp * exp(-k / tau)`` makes
    the stop rule fire at ``epochs`` or later (by bisection: a slower decay stops later). The
    stop moves in steps as ``tau`` grows (an improvement just over ``min_delta`` resets the
    patience), so it may land up to ``patience`` epochs after ``epochs``."""
    k = np.arange(1, 4 * epochs + 10)

    def stops_by(tau: float) -> bool:
        stop = stop_rule_epoch(amp * np.exp(-k / tau), patience, min_delta)
        return stop is not None and stop >= epochs

    low, high = 1e-3, float(epochs)
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (low, mid) if stops_by(mid) else (mid, high)
    return high


def learning_curve(epochs: int, rng: np.random.Generator, length: int) -> tuple[float, ...]:
    """A noisy loss curve whose noise-free version stops at ``epochs`` (``length`` values)."""
    floor, amp = rng.uniform(0.5, 1.5), rng.uniform(1.0, 3.0)
    tau = curve_tau(epochs, amp)
    k = np.arange(1, length + 1)
    values = floor + amp * np.exp(-k / tau) + rng.normal(0.0, SIGMA, size=length)
    return tuple(float(v) for v in values)


def stop_rule_truth(targets: Sequence[int], seed: int) -> tuple[tuple[int, ...], tuple[tuple[float, ...], ...]]:
    """Per model: a learning curve drawn for its target epochs and the epoch its stop rule fires
    (the curve's last epoch where it never does)."""
    rng = np.random.default_rng([seed, 4057])
    epochs, curves = [], []
    for target in targets:
        curve = learning_curve(int(target), rng, 3 * int(target) + 10)
        stop = stop_rule_epoch(curve)
        epochs.append(stop if stop is not None else len(curve))
        curves.append(curve)
    return tuple(epochs), tuple(curves)


def noisy_scenario(workload: Workload, total_gpus: int, seed: int, spread: float, model: str = "uniform") -> Scenario:
    """The simulator input of ``workload`` on ``total_gpus`` GPUs under noise ``model``
    (see the module docstring); ``uniform`` with ``spread`` 0 gives exact estimates."""
    if model not in NOISE_MODELS:
        raise ValueError(f"unknown noise model {model!r}; valid: {', '.join(NOISE_MODELS)}")
    if model == "uniform":
        return workload.scenario(total_gpus, noisy_estimates(workload.true_epochs, seed, spread) if spread else None)
    truth, curves = stop_rule_truth(workload.true_epochs, seed)
    estimates = noisy_estimates(truth, seed, spread) if spread else tuple(float(e) for e in truth)
    base = workload.scenario(total_gpus)
    return Scenario(base.rates, truth, estimates, base.cluster, curves=curves)
