"""A family of synthetic workloads: every instance's parameters drawn, for benchmarks no policy
was tuned on.

``paper100`` and ``scale`` are two fixed generators; a planner tuned on them is tuned to them.
The family draws, per instance (one seed), the parameters those generators fix:

* **rate spread**: single-GPU rates lognormal around ``MEDIAN_RATE`` (80 samples/s) with
  ``sigma`` uniform in ``SIGMA_RANGE`` (0.3-1.0, in log space);
* **scaling**: ``r(m) = r(1) * m * eff ** log2(m)``, each model's ``eff`` uniform in the range
  of its scaling class (``SCALING_CLASSES``: poor 0.6-0.8, typical 0.75-0.97, near-linear
  0.97-0.995), the classes mixed in proportions drawn per instance (flat Dirichlet);
* **cross-node penalty**: the rate times ``cross_node`` (uniform in ``CROSS_NODE_RANGE``) once a
  group spans more than one node;
* **GPUs per node**: 4, 6 or 8;
* **profile depth**: the rates are "measured" up to one node, two nodes (the paper's ``M_b``) or
  FLEET's ``M_t`` (:func:`~fleet.schedule.rates.threshold_gpus`), Eq. 5 beyond, as a profile
  would give them (the simulator trains at the table's rates, the extrapolated ones included);
* **epochs**: one of ``EPOCH_SHAPES`` -- ``uniform`` (5-60), ``bimodal`` (a drawn share of long
  models, 40-60 epochs, among short ones, 5-15) or ``heavy`` (Pareto-tailed from 5, capped at
  300);
* **GPU count**: the GPUs/models ratio log-uniform in ``RATIO_RANGE`` (1/8 to 2), the count
  rounded to whole GPUs (the last node may be partly used, as ``Cluster`` allows).

Parameter bytes grow as the single-GPU rate falls (5 M parameters at the fastest model, 100 M at
the slowest, as in ``scale``); an epoch is ``SAMPLES_PER_EPOCH`` (50,000) samples.

A :class:`FamilyCell` fixes some parameters (the GPUs/models ratio, GPUs per node, the shape) and
the rest are drawn. The shape ``issue`` is issue 46's table, fixed: sigma 0.6, every model
``typical`` (eff 0.75-0.97), cross-node 0.93, profiled to two nodes, epochs uniform 5-60; the
shapes ``uniform``, ``bimodal`` and ``heavy`` fix the epochs distribution and draw the rest.
Every parameter is drawn whether or not the cell fixes it, so one seed gives the same draws
in every cell (common random numbers between cells).

An instance is a pure function of ``(cell, models, seed)``, everything from
``numpy.random.default_rng``; ``fleet simulate --workload family --seed S`` rebuilds it. Tune on
``TUNING_SEEDS``, report on ``REPORTING_SEEDS``: the two never overlap.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fleet.schedule.rates import ModelProfile, RateTable, threshold_gpus
from fleet.schedule.scenario import Scenario
from fleet.schedule.workloads import Workload

TUNING_SEEDS = range(0, 1000)
"""Seeds a policy may be tuned on."""
REPORTING_SEEDS = range(1000, 2000)
"""Seeds the figures are reported on (never tuned on)."""

DEFAULT_MODELS = 300
MEDIAN_RATE = 80.0
SAMPLES_PER_EPOCH = 50_000
SIGMA_RANGE = (0.3, 1.0)
SCALING_CLASSES = {"poor": (0.6, 0.8), "typical": (0.75, 0.97), "near-linear": (0.97, 0.995)}
CROSS_NODE_RANGE = (0.85, 1.0)
GPUS_PER_NODE_CHOICES = (4, 6, 8)
RATIO_RANGE = (1 / 8, 2.0)
PROFILE_DEPTHS = ("node", "two-nodes", "m_t")
EPOCH_SHAPES = ("uniform", "bimodal", "heavy")
SHAPES = ("issue", *EPOCH_SHAPES)
"""Cell shapes: ``issue`` fixes everything but the GPU count and GPUs per node to issue 46's
table; the others fix the epochs distribution."""

UNIFORM_EPOCHS = (5, 60)
SHORT_EPOCHS, LONG_EPOCHS, LONG_SHARE_RANGE = (5, 15), (40, 60), (0.1, 0.5)
HEAVY_MIN_EPOCHS, HEAVY_MAX_EPOCHS, HEAVY_ALPHA_RANGE = 5, 300, (1.2, 2.0)
ISSUE_SIGMA, ISSUE_CROSS_NODE = 0.6, 0.93
_STREAM = 4646  # the family's own random stream (the noise models use others)


class FamilyError(ValueError):
    """A cell parameter out of its range.

    Attributes:
        field: the parameter (``gpus_ratio``, ``gpus_per_node``, ``shape``, ``models``).
        problem: what is wrong with it.
    """

    def __init__(self, field: str, problem: str):
        self.field, self.problem = field, problem
        super().__init__(f"{field}: {problem}")


@dataclass(frozen=True)
class FamilyCell:
    """The parameters a benchmark cell fixes; None: drawn per instance.

    Attributes:
        shape: one of ``SHAPES``.
        gpus_ratio: GPUs per model, in ``RATIO_RANGE``.
        gpus_per_node: one of ``GPUS_PER_NODE_CHOICES``.
    """

    shape: str = "issue"
    gpus_ratio: float | None = None
    gpus_per_node: int | None = None

    def __post_init__(self) -> None:
        if self.shape not in SHAPES:
            raise FamilyError("shape", f"unknown {self.shape!r}; valid: {', '.join(SHAPES)}")
        low, high = RATIO_RANGE
        if self.gpus_ratio is not None and not (math.isfinite(self.gpus_ratio) and low <= self.gpus_ratio <= high):
            raise FamilyError("gpus_ratio", f"expected GPUs per model in {low:g}..{high:g}, got {self.gpus_ratio!r}")
        if self.gpus_per_node is not None and self.gpus_per_node not in GPUS_PER_NODE_CHOICES:
            valid = ", ".join(map(str, GPUS_PER_NODE_CHOICES))
            raise FamilyError("gpus_per_node", f"expected one of {valid}, got {self.gpus_per_node!r}")

    @property
    def label(self) -> str:
        """``shape, ratio, gpn`` with ``*`` for what is drawn."""
        ratio = "*" if self.gpus_ratio is None else f"{self.gpus_ratio:g}"
        gpn = "*" if self.gpus_per_node is None else str(self.gpus_per_node)
        return f"{self.shape}, {ratio} GPUs/model, {gpn} GPUs/node"


@dataclass(frozen=True)
class FamilyParameters:
    """What one instance of the family was drawn with.

    Attributes:
        seed: the instance's seed.
        models: number of models.
        shape: the cell's shape (``issue`` or the epochs distribution).
        gpus_per_node: GPUs per node.
        gpus_ratio: GPUs per model (drawn or fixed).
        gpus: the GPU count, ``max(1, round(gpus_ratio * models))``.
        sigma: spread of the single-GPU rates in log space.
        scaling_mix: share of each of ``SCALING_CLASSES`` (adds up to 1).
        cross_node: rate factor once a group spans nodes.
        profile_depth: one of ``PROFILE_DEPTHS``.
        long_share: share of long models (``bimodal``; else 0).
        tail_alpha: Pareto index of the epochs (``heavy``; else 0).
    """

    seed: int
    models: int
    shape: str
    gpus_per_node: int
    gpus_ratio: float
    gpus: int
    sigma: float
    scaling_mix: tuple[float, float, float]
    cross_node: float
    profile_depth: str
    long_share: float
    tail_alpha: float

    def describe(self, own_gpus: bool = True) -> str:
        """One line: the instance's parameters (its GPU count unless ``own_gpus`` is False)."""
        mix = "/".join(f"{x:.2f}" for x in self.scaling_mix)
        epochs = {"issue": "uniform (issue 46)", "bimodal": f"bimodal, long share {self.long_share:.2f}",
                  "heavy": f"heavy, tail alpha {self.tail_alpha:.2f}"}.get(self.shape, self.shape)
        gpus = f" on {self.gpus} GPUs ({self.gpus_ratio:.3g}/model)" if own_gpus else ""
        return (f"{self.models} models{gpus}, {self.gpus_per_node} GPUs/node, sigma {self.sigma:.2f}, scaling "
                f"poor/typical/near-linear {mix}, cross-node x{self.cross_node:.3f}, profiled to {self.profile_depth}, "
                f"epochs {epochs}")


@dataclass(frozen=True)
class FamilyInstance:
    """One drawn instance: its parameters and its workload.

    Attributes:
        parameters: what it was drawn with.
        workload: the rate table and the true epochs.
    """

    parameters: FamilyParameters
    workload: Workload

    def scenario(self, estimates: Sequence[float] | None = None) -> Scenario:
        """The simulator input on the instance's own GPU count; estimates default to the truth."""
        return self.workload.scenario(self.parameters.gpus, estimates)


def draw_parameters(seed: int, models: int = DEFAULT_MODELS, cell: FamilyCell = FamilyCell()) -> FamilyParameters:
    """The instance parameters of ``seed`` in ``cell`` (see the module docstring).

    Raises:
        FamilyError: ``models`` below 1.
    """
    if isinstance(models, bool) or not isinstance(models, int) or models < 1:
        raise FamilyError("models", f"expected a positive integer, got {models!r}")
    drawn = _draw_all(np.random.default_rng([seed, _STREAM]))
    if cell.shape == "issue":
        drawn.update(sigma=ISSUE_SIGMA, scaling_mix=(0.0, 1.0, 0.0), cross_node=ISSUE_CROSS_NODE,
                     profile_depth="two-nodes")
    ratio, gpn = drawn.pop("gpus_ratio"), drawn.pop("gpus_per_node")
    ratio = ratio if cell.gpus_ratio is None else float(cell.gpus_ratio)
    gpn = gpn if cell.gpus_per_node is None else cell.gpus_per_node
    if cell.shape != "bimodal":
        drawn["long_share"] = 0.0
    if cell.shape != "heavy":
        drawn["tail_alpha"] = 0.0
    return FamilyParameters(seed=seed, models=models, shape=cell.shape, gpus_per_node=gpn, gpus_ratio=ratio,
                            gpus=max(1, round(ratio * models)), **drawn)


def family_instance(seed: int, models: int = DEFAULT_MODELS, cell: FamilyCell = FamilyCell()) -> FamilyInstance:
    """The instance of ``seed`` in ``cell``: its parameters and its workload."""
    params = draw_parameters(seed, models, cell)
    rng = np.random.default_rng([seed, _STREAM, 1])
    single = MEDIAN_RATE * np.exp(rng.normal(0.0, params.sigma, size=models))
    eff = _efficiencies(params.scaling_mix, rng, models)
    epochs = _epochs(params, rng)
    depth = _profile_depth(params, single)
    params_count = _parameter_counts(single)
    profiles = tuple(
        ModelProfile(id=f"f{i:05d}", rates=_curve(single[i], eff[i], params, depth), epochs=float(epochs[i]),
                     param_bytes=int(params_count[i] * 4))
        for i in range(models)
    )
    table = RateTable(profiles, params.gpus_per_node, SAMPLES_PER_EPOCH)
    name = f"family-{params.shape}-s{seed}"
    return FamilyInstance(params, Workload(name, table, tuple(int(e) for e in epochs)))


def _draw_all(rng: np.random.Generator) -> dict:
    """Every drawable parameter, in a fixed order (so fixing one leaves the others' draws alone)."""
    low, high = RATIO_RANGE
    return {
        "gpus_ratio": float(np.exp(rng.uniform(np.log(low), np.log(high)))),
        "gpus_per_node": int(rng.choice(GPUS_PER_NODE_CHOICES)),
        "sigma": float(rng.uniform(*SIGMA_RANGE)),
        "scaling_mix": tuple(float(x) for x in rng.dirichlet(np.ones(len(SCALING_CLASSES)))),
        "cross_node": float(rng.uniform(*CROSS_NODE_RANGE)),
        "profile_depth": str(rng.choice(PROFILE_DEPTHS)),
        "long_share": float(rng.uniform(*LONG_SHARE_RANGE)),
        "tail_alpha": float(rng.uniform(*HEAVY_ALPHA_RANGE)),
    }


def _efficiencies(mix: Sequence[float], rng: np.random.Generator, models: int) -> np.ndarray:
    """Each model's ``eff``: its class drawn by ``mix``, then uniform in the class's range."""
    ranges = np.array(list(SCALING_CLASSES.values()))
    classes = rng.choice(len(ranges), size=models, p=np.asarray(mix) / sum(mix))
    return rng.uniform(ranges[classes, 0], ranges[classes, 1])


def _epochs(params: FamilyParameters, rng: np.random.Generator) -> np.ndarray:
    """True epochs per model, by the shape's distribution (``issue``: uniform)."""
    n = params.models
    if params.shape == "bimodal":
        long = rng.uniform(size=n) < params.long_share
        return np.where(long, rng.integers(LONG_EPOCHS[0], LONG_EPOCHS[1] + 1, size=n),
                        rng.integers(SHORT_EPOCHS[0], SHORT_EPOCHS[1] + 1, size=n))
    if params.shape == "heavy":
        tail = HEAVY_MIN_EPOCHS * (1 + rng.pareto(params.tail_alpha, size=n))
        return np.minimum(np.round(tail), HEAVY_MAX_EPOCHS).astype(int)
    return rng.integers(UNIFORM_EPOCHS[0], UNIFORM_EPOCHS[1] + 1, size=n)


def _profile_depth(params: FamilyParameters, single: np.ndarray) -> int:
    """GPU counts "measured": one node, two nodes, or FLEET's ``M_t``."""
    gpn = params.gpus_per_node
    if params.profile_depth == "node":
        return gpn
    if params.profile_depth == "two-nodes":
        return 2 * gpn
    return threshold_gpus(single, gpn)


def _parameter_counts(single: np.ndarray) -> np.ndarray:
    """5 M parameters at the fastest model, 100 M at the slowest, log-linear in the rate."""
    logs = np.log(single)
    span = logs.max() - logs.min()
    position = (logs.max() - logs) / span if span > 0 else np.zeros_like(logs)
    return 5e6 * 20.0 ** position


def _curve(single: float, eff: float, params: FamilyParameters, depth: int) -> tuple[float, ...]:
    """``r(m) = r(1) m eff^log2(m)``, times ``cross_node`` past one node, for ``m = 1..depth``."""
    m = np.arange(1, depth + 1)
    rates = single * m * eff ** np.log2(m) * np.where(m > params.gpus_per_node, params.cross_node, 1.0)
    return tuple(round(float(r), 3) for r in rates)

