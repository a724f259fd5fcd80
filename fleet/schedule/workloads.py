"""Synthetic ensembles shaped like the FLEET paper's evaluation, for the simulator.

``paper100`` mimics the paper's setting: 100 ResNet- and DenseNet-like variants trained on
Caltech-256 (30,606 samples per epoch) on nodes of 4 GPUs.

* Each model is a family (ResNet-18/34/50/101/152, DenseNet-121/161/169/201) at a width
  multiplier; its cost is the family's GFLOPs times ``width**2`` with +-20 % noise, and its
  parameter bytes the family's parameter count times ``width**2`` (fp32).
* Single-GPU rates are proportional to ``cost**-0.8`` and stretched (in log space) to span
  exactly 21-176 samples/s, the range the paper reports.
* Multi-GPU scaling is sub-linear: ``r(m) = r(1) * m / (1 + c (m - 1))``, with a further
  loss when a group spans nodes; small, fast models scale worse (larger ``c``). Rates are
  "measured" up to ``M_t`` and extrapolated with Eq. 5 beyond, as FLEET's profiler would.
* Epochs to converge are drawn uniformly from 10..40, independently of size.

Everything is drawn from ``numpy.random.default_rng(seed)``: a seed gives the same ensemble.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fleet.schedule.rates import ModelProfile, RateTable, threshold_gpus
from fleet.schedule.scenario import Cluster, Scenario

CALTECH256_SAMPLES = 30_606
PAPER_GPUS_PER_NODE = 4
PAPER_RATE_RANGE = (21.0, 176.0)
PAPER_EPOCH_RANGE = (10, 40)

# family: (GFLOPs at 224x224, parameters in millions with a 257-way classifier)
_FAMILIES = {
    "resnet18": (1.8, 11.3),
    "resnet34": (3.6, 21.4),
    "resnet50": (4.1, 24.0),
    "resnet101": (7.8, 43.0),
    "resnet152": (11.5, 58.7),
    "densenet121": (2.9, 7.2),
    "densenet169": (3.4, 12.8),
    "densenet201": (4.3, 18.6),
    "densenet161": (7.8, 27.1),
}


@dataclass(frozen=True)
class Workload:
    """An ensemble with its true epochs to converge.

    Attributes:
        name: workload name.
        rates: the profile; its ``epochs`` fields hold the true epochs (an oracle estimate).
        true_epochs: epochs each model really needs.
    """

    name: str
    rates: RateTable
    true_epochs: tuple[int, ...]

    def scenario(self, total_gpus: int, estimates: Sequence[float] | None = None) -> Scenario:
        """The simulator input on ``total_gpus`` GPUs; estimates default to the truth."""
        guesses = tuple(float(e) for e in (self.true_epochs if estimates is None else estimates))
        cluster = Cluster(total_gpus, self.rates.gpus_per_node)
        return Scenario(self.rates, self.true_epochs, guesses, cluster)


def noisy_estimates(epochs: Sequence[float], seed: int, spread: float = 0.3) -> tuple[float, ...]:
    """Each estimate multiplied by an independent ``U(1 - spread, 1 + spread)`` factor."""
    rng = np.random.default_rng([seed, 7919])
    factors = rng.uniform(1 - spread, 1 + spread, size=len(epochs))
    return tuple(float(e * f) for e, f in zip(epochs, factors))


def paper100(seed: int = 0, models: int = 100) -> Workload:
    """The paper-shaped ensemble (see the module docstring)."""
    rng = np.random.default_rng(seed)
    names = list(_FAMILIES)
    family = rng.choice(len(names), size=models)
    width = rng.choice([0.5, 0.75, 1.0, 1.25, 1.5], size=models)
    flops = np.array([_FAMILIES[names[f]][0] for f in family]) * width**2
    cost = flops * rng.uniform(0.8, 1.2, size=models)
    single = _stretch(cost**-0.8, *PAPER_RATE_RANGE)
    params = np.array([_FAMILIES[names[f]][1] for f in family]) * 1e6 * width**2
    depth = threshold_gpus(single, PAPER_GPUS_PER_NODE)
    epochs = rng.integers(PAPER_EPOCH_RANGE[0], PAPER_EPOCH_RANGE[1] + 1, size=models)
    profiles = tuple(
        ModelProfile(
            id=f"{names[family[i]]}-w{width[i]:g}-{i:03d}",
            rates=_scaling_curve(single[i], depth, _scaling_loss(single[i], rng), rng),
            epochs=float(epochs[i]),
            param_bytes=int(params[i] * 4),
        )
        for i in range(models)
    )
    table = RateTable(profiles, PAPER_GPUS_PER_NODE, CALTECH256_SAMPLES)
    return Workload("paper100", table, tuple(int(e) for e in epochs))


def scale(seed: int = 0, models: int = 1000, gpus_per_node: int = PAPER_GPUS_PER_NODE,
          rate_range: tuple[float, float] = PAPER_RATE_RANGE,
          epoch_range: tuple[int, int] = PAPER_EPOCH_RANGE, samples_per_epoch: int = CALTECH256_SAMPLES) -> Workload:
    """A large synthetic ensemble: ``models`` models whose single-GPU rates are log-uniform in
    ``rate_range``, epochs uniform in ``epoch_range``, parameter bytes growing as the rate falls
    (5 M parameters at the fastest, 100 M at the slowest), the paper's scaling curves on
    nodes of ``gpus_per_node`` GPUs. Seeded like :func:`paper100`."""
    rng = np.random.default_rng([seed, 1000])
    low, high = rate_range
    single = np.exp(rng.uniform(np.log(low), np.log(high), size=models))
    params = 5e6 * (high / single) ** (np.log(20) / np.log(high / low))
    epochs = rng.integers(epoch_range[0], epoch_range[1] + 1, size=models)
    depth = threshold_gpus(single, gpus_per_node)
    profiles = tuple(
        ModelProfile(
            id=f"m{i:05d}",
            rates=_scaling_curve(single[i], depth, _scaling_loss(single[i], rng), rng, gpus_per_node),
            epochs=float(epochs[i]),
            param_bytes=int(params[i] * 4),
        )
        for i in range(models)
    )
    table = RateTable(profiles, gpus_per_node, samples_per_epoch)
    return Workload(f"scale{models}", table, tuple(int(e) for e in epochs))


WORKLOADS = {"paper100": paper100, "scale": scale}
"""Workload generators by name: ``name -> f(seed, models=...) -> Workload``."""


def _stretch(values: np.ndarray, low: float, high: float) -> np.ndarray:
    """Affine map of ``log(values)`` onto ``[log(low), log(high)]``."""
    logs = np.log(values)
    unit = (logs - logs.min()) / (logs.max() - logs.min())
    return np.exp(np.log(low) + unit * (np.log(high) - np.log(low)))


def _scaling_loss(single_rate: float, rng: np.random.Generator) -> float:
    """Amdahl-like loss ``c``: 0.03 for the slowest models up to ~0.12 for the fastest."""
    low, high = PAPER_RATE_RANGE
    position = (np.log(single_rate) - np.log(low)) / (np.log(high) - np.log(low))
    return float(0.03 + 0.09 * position + rng.uniform(-0.01, 0.01))


def _scaling_curve(single_rate: float, depth: int, loss: float, rng: np.random.Generator,
                   gpus_per_node: int = PAPER_GPUS_PER_NODE) -> tuple[float, ...]:
    cross_node = rng.uniform(0.04, 0.10)
    curve = []
    for m in range(1, depth + 1):
        rate = single_rate * m / (1 + loss * (m - 1))
        if m > gpus_per_node:
            rate *= 1 - cross_node
        curve.append(round(float(rate), 3))
    return tuple(curve)
