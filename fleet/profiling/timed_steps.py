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
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections.abc import Mapping, Sequence

PER_FAMILY = 3
BATCHES = 4  # steps per timed model, the first ones a warm-up
TIMED = 2  # of them, the last ones timed
DECODE_SECONDS = 0.5  # one preprocessor's decoding, timed


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
