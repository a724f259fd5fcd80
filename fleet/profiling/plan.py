"""What to measure and where: pure functions, no MPI or torch (tested in plain pytest).

The FLEET paper's profiler trains each model for at most `profile_batches` batches on m GPUs
and times the last `timed` of them, for m = 1..M_t with
M_t = max(ceil(max_i r_i(1) / min_i r_i(1)), 2 * gpus_per_node), capped by the GPUs there
are; Eq. 5 extrapolates beyond. Independent (model, m) measurements run at the same time on
disjoint trainers: `waves` packs them, node-local whenever m fits on one node. Models that
train at the same speed (`speed_key`: a sweep over learning rates, schedules or stop rules of
one architecture) are timed once, by the first of them (`timed_as`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Measurement:
    """One model timed on the trainers `gpus` (global trainer indices; node = gpu // g)."""

    model: str
    gpus: tuple[int, ...]

    @property
    def m(self) -> int:
        return len(self.gpus)


def speed_key(model, emulated: bool = False) -> str:
    """What a model's step time depends on (a spec's `ModelSpec`): its framework, architecture,
    batch size and optimizer, with or without momentum and weight decay; not its learning rate,
    schedule, epochs, stop rule or seed. On the emulated device, its id too (its rates are its own)."""
    train = model.train
    facts = {"framework": model.framework, "family": model.family, "params": model.params, "optimizer": train.optimizer,
             "batch_size": train.batch_size, "momentum": train.momentum > 0, "weight_decay": train.weight_decay > 0,
             "id": model.id if emulated else None}
    return json.dumps(facts, sort_keys=True, default=str)


def timed_as(models: Sequence, emulated: bool = False) -> dict[str, str]:
    """Each model's id -> the id of the first model (in the given order) of the same
    `speed_key`: the one whose measurements stand for both."""
    first: dict[str, str] = {}
    return {model.id: first.setdefault(speed_key(model, emulated), model.id) for model in models}


def threshold_gpus(single_rates: Mapping[str, float], gpus_per_node: int, total_gpus: int) -> int:
    """The paper's M_t: the largest group size profiled (capped by `total_gpus`)."""
    rates = [r for r in single_rates.values() if r > 0]
    spread = math.ceil(max(rates) / min(rates)) if rates else 1
    return max(1, min(total_gpus, max(spread, 2 * gpus_per_node)))


def waves(jobs: Sequence[tuple[str, int]], gpus_per_node: int, total_gpus: int) -> list[list[Measurement]]:
    """Pack `(model, m)` jobs into waves of measurements on disjoint trainers.

    Larger groups go first (first fit decreasing). A group of m <= gpus_per_node trainers
    lies on one node, in consecutive trainers; a larger one takes whole nodes (its first m
    trainers). Within a wave, jobs keep their given order among equal m.

    Raises:
        ValueError: a job asks for more trainers than there are, or for m < 1.
    """
    for model, m in jobs:
        if not 1 <= m <= total_gpus:
            raise ValueError(f"{model}: cannot time {m} trainer(s) of {total_gpus}")
    pending = sorted(jobs, key=lambda job: -job[1])
    out: list[list[Measurement]] = []
    while pending:
        free = [True] * total_gpus
        wave, rest = [], []
        for model, m in pending:
            gpus = _fit(free, m, gpus_per_node)
            if gpus is None:
                rest.append((model, m))
                continue
            for g in gpus:
                free[g] = False
            wave.append(Measurement(model, gpus))
        out.append(wave)
        pending = rest
    return out


def _fit(free: list[bool], m: int, gpn: int) -> tuple[int, ...] | None:
    total = len(free)
    if m <= gpn:
        for node_start in range(0, total, gpn):
            node = range(node_start, min(node_start + gpn, total))
            for start in node:
                run = range(start, start + m)
                if run.stop <= node.stop and all(free[g] for g in run):
                    return tuple(run)
        return None
    nodes_needed = math.ceil(m / gpn)
    for first in range(0, total, gpn):
        span = range(first, min(first + nodes_needed * gpn, total))
        if len(span) >= m and all(free[g] for g in span):
            return tuple(span[:m])
    return None


def preprocessor_counts(available: int) -> list[int]:
    """1, 2, 4, ... up to `available` (which is included)."""
    counts, k = [], 1
    while k < available:
        counts.append(k)
        k *= 2
    if available >= 1:
        counts.append(available)
    return counts


def needed_preprocessors(
    stream_rates: Sequence[float], decode_rates: Mapping[int, float], nodes: int
) -> int:
    """Preprocessors per node that keep up with the busiest moment of a plan.

    Args:
        stream_rates: per moment of the plan, the samples/s all its streams consume together
            (each stream moves at its slowest member's rate and is decoded once).
        decode_rates: measured samples/s of k preprocessor processes together, by k.
        nodes: nodes the streams' decoding is spread over.

    Returns the smallest measured k per node whose rate covers the need; beyond the largest
    k measured, more processes at that k's rate per process.
    """
    if not decode_rates or not stream_rates:
        return 1
    need = max(stream_rates) / max(1, nodes)
    for k in sorted(decode_rates):
        if decode_rates[k] >= need:
            return k
    largest = max(decode_rates)
    return max(largest, math.ceil(need / (decode_rates[largest] / largest)))


def decode_capacity(decode_rates: Mapping[int, float], per_node: int, nodes: int) -> float | None:
    """Samples/s that `per_node` preprocessors on each of `nodes` nodes decode together.

    The measured rate of `per_node` processes; for a count not measured, the rate per
    process of the largest count measured below it (or of the smallest measured) times
    `per_node`. None when nothing was measured (decoding is then taken to keep up).
    """
    if not decode_rates or per_node < 1 or nodes < 1:
        return None
    if per_node in decode_rates:
        return decode_rates[per_node] * nodes
    below = [k for k in decode_rates if k < per_node]
    k = max(below) if below else min(decode_rates)
    return decode_rates[k] / k * per_node * nodes


# -- is profiling worth its time? ----------------------------------------------------------------

DECODE_SECONDS = 1.0  # the profiler times decoding this long for each preprocessor count
JOB_OVERHEAD_S = 1.0  # a measurement besides its batches: building the engine and the group, warming
#                       up, closing (0.86-0.93 s measured on the 2-core VM, groups under Horovod)
PROFILE_SHARE = 0.10  # profile when it costs at most this share of the training it plans


def predicted_profiling_s(models: Sequence, rate: Callable[[str, int], float], batches: int, gpus_per_node: int,
                          total_gpus: int, preprocessors: int) -> tuple[float, int]:
    """Seconds the profiler would take and the (model, m) pairs it would time, for `models`
    (spec `ModelSpec`s) whose rates (samples/s on m trainers) `rate(id, m)` guesses: its waves
    (each as long as its slowest measurement: `batches` steps of m x batch_size samples, plus
    `JOB_OVERHEAD_S`) and its decoding phase (`preprocessors` in the job)."""
    timed = sorted(set(timed_as(models).values()))
    by_id = {model.id: model for model in models}
    m_t = threshold_gpus({model: rate(model, 1) for model in timed}, gpus_per_node, total_gpus)
    jobs = [(model, m) for m in range(1, m_t + 1) for model in timed]

    def seconds(job: Measurement) -> float:
        samples = batches * job.m * by_id[job.model].train.batch_size
        return JOB_OVERHEAD_S + samples / max(rate(job.model, job.m), 1e-9)

    total = sum(max(map(seconds, wave)) for wave in waves(jobs, gpus_per_node, total_gpus))
    return total + DECODE_SECONDS * len(preprocessor_counts(preprocessors)), len(jobs)


def profiling_verdict(profiling_s: float, pairs: int, training_s: float) -> tuple[bool, str]:
    """Whether to profile before training that is predicted to take `training_s`, and why.
    Measured rates make a better plan than FLOPs estimates, which training refines from its
    first steps anyway (the 32-model CPU sweep: 9% shorter makespan, for profiling that took
    longer than the training); so profile when it costs at most `PROFILE_SHARE` of it."""
    share = profiling_s / max(training_s, 1e-9)
    cost = (f"measuring {pairs} (model, trainer count) pair(s) would take about {profiling_s:,.0f} s, "
            f"{share:.0%} of the {training_s:,.0f} s predicted for training with estimated rates")
    if share <= PROFILE_SHARE:
        return True, f"profiling first: {cost}"
    return False, (f"not profiling: {cost}; planning with rates estimated from FLOPs, corrected by timing a few "
                   f"steps of each model family first and refined from the steps measured while training "
                   f"(scheduler.profile: true measures first)")
