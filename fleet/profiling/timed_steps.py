"""Rates estimated from FLOPs, corrected by a few timed steps per model family (pure).

Where a job does not profile (``scheduler.profile: auto`` judged a profile too dear beside the
training), its rates are estimated from each model's FLOPs per sample. That estimate misses
what a step costs besides its arithmetic (launching kernels, the optimizer, Python): small
nets train 2-3x slower than their FLOPs say, large ones about as fast. So before planning,
the job times a few steps of up to `PER_FAMILY` models of each family on one trainer each --
the smallest, the middle and the largest by FLOPs -- and corrects every estimate by the
measured over the estimated rate, interpolated in log FLOPs between the timed models of its
family (the nearest one's beyond them; the median correction of all timed models for a family
none was timed of). The timings go to ``steps.json`` in the run directory, reused by the next
job of the same ensemble.

Data-parallel groups: where groups of several trainers can form, the job also times the timed
models with the fewest and the most parameter bytes on 2 .. (a node's trainers) trainers. A
group's step takes its replica's step plus what the group adds (the gradients' allreduce and
the members' waits for each other): per trainer count m, the added seconds per step
``o_m(B) = a_m + b_m * B`` are fitted through the two models (B: parameter bytes; a_m, b_m >= 0),
and every model's group rate is ``m * batch / (batch / r(1) + o_m(B))``. Without them the
estimate assumes ``r(m) = r(1) * m ** 0.9``, which on CPU trainers, whose allreduce shares the
cores the steps run on, is far from true.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

PER_FAMILY = 3
BATCHES = 4  # steps per timed model, the first ones a warm-up
TIMED = 2  # of them, the last ones timed
DECODE_SECONDS = 0.5  # one preprocessor's decoding, timed
PROBE_BATCHES = 30  # steps of the contention probe's model, beside the others and alone
PROBE_TIMED = 20  # (`fleet.profiling.contention`): a CPU switches threads every few ms


def representatives(flops: Mapping[str, float], families: Mapping[str, str], candidates: Sequence[str],
                    per_family: int = PER_FAMILY) -> list[str]:
    """The models to time: of each family among `candidates` (one per speed), the smallest, the
    middle and the largest by FLOPs per sample (fewer where the family has fewer)."""
    by_family: dict[str, list[str]] = {}
    for model in candidates:
        by_family.setdefault(families[model], []).append(model)
    chosen: list[str] = []
    for members in by_family.values():
        members.sort(key=lambda m: (flops[m], m))
        picks = sorted({round(k * (len(members) - 1) / max(1, per_family - 1)) for k in range(per_family)})
        chosen += [members[k] for k in picks]
    return chosen


def corrections(estimated: Mapping[str, float], measured: Mapping[str, float], flops: Mapping[str, float],
                families: Mapping[str, str]) -> dict[str, float]:
    """Per model of `estimated` (its estimated single-trainer rate), the factor to multiply its
    estimated rates by, from the `measured` rates of the timed models (see the module)."""
    points: dict[str, list[tuple[float, float]]] = {}
    for model, rate in measured.items():
        if model in estimated and estimated[model] > 0 and rate > 0:
            points.setdefault(families[model], []).append((math.log(flops[model]), math.log(rate / estimated[model])))
    everyone = [y for family in points.values() for _, y in family]
    default = statistics.median(everyone) if everyone else 0.0
    return {model: math.exp(_interpolated(sorted(points.get(families[model], [])), math.log(flops[model]), default))
            for model in estimated}


def _interpolated(points: list[tuple[float, float]], x: float, default: float) -> float:
    """Piecewise-linear through `points` (sorted by x), flat beyond the ends; `default` without any."""
    if not points:
        return default
    xs = [p[0] for p in points]
    k = bisect.bisect_left(xs, x)
    if k == 0:
        return points[0][1]
    if k == len(points):
        return points[-1][1]
    (x0, y0), (x1, y1) = points[k - 1], points[k]
    return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def group_representatives(param_bytes: Mapping[str, int], timed: Sequence[str]) -> list[str]:
    """The timed models whose groups are timed too: the fewest and the most parameter bytes
    (one model where they are the same)."""
    if not timed:
        return []
    ordered = sorted(timed, key=lambda m: (param_bytes.get(m, 0), m))
    return sorted({ordered[0], ordered[-1]}, key=ordered.index)


def group_counts(gpus_per_node: int, gpus: int) -> list[int]:
    """The trainer counts groups are timed on: 2 .. a node's trainers (none on one trainer)."""
    return list(range(2, min(gpus_per_node, gpus) + 1))


@dataclass(frozen=True)
class GroupCost:
    """What a group of `m` trainers adds to each step: ``fixed_s + per_byte_s * parameter bytes``."""

    m: int
    fixed_s: float
    per_byte_s: float

    def seconds(self, param_bytes: float) -> float:
        return self.fixed_s + self.per_byte_s * param_bytes


def group_costs(step_s: Mapping[str, Mapping[int, float]], param_bytes: Mapping[str, int]) -> list[GroupCost]:
    """Per timed trainer count m, the line through the timed models' added seconds per step
    (their step on m trainers less their step on one: `step_s[model][m]`, `step_s[model][1]`),
    by parameter bytes; both coefficients kept >= 0 (with one model: all of it fixed)."""
    counts = sorted({m for by_m in step_s.values() for m in by_m if m > 1})
    costs = []
    for m in counts:
        points = sorted((param_bytes.get(model, 0), max(0.0, by_m[m] - by_m[1]))
                        for model, by_m in step_s.items() if m in by_m and 1 in by_m)
        if not points:
            continue
        (b0, o0), (b1, o1) = points[0], points[-1]
        slope = max(0.0, (o1 - o0) / (b1 - b0)) if b1 > b0 else 0.0
        fixed = max(0.0, o0 - slope * b0) if slope else (o0 + o1) / 2
        costs.append(GroupCost(m, fixed, slope))
    return costs


def group_rates(rate_1: float, batch: int, param_bytes: float, costs: Sequence[GroupCost]) -> dict[int, float]:
    """A model's rate on each timed trainer count: ``m * batch / (batch / r(1) + o_m(B))``."""
    step_1 = batch / rate_1
    return {c.m: c.m * batch / (step_1 + c.seconds(param_bytes)) for c in costs}
