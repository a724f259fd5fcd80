"""Scheduling at scale: fleet-adaptive on 1,000 models, 250 to 1,000 GPUs; prints markdown.

The ``scale`` workload (``fleet.schedule.workloads.scale``: 1,000 models, single-GPU rates
log-uniform in 21-176 samples/s, 10-40 epochs, 4 GPUs per node), under the three noise models
of ``bench/sched_paper.py`` (exact estimates, x U(0.7, 1.3), the stop-rule model), seeded.
Planning time is measured around every policy call and charged to the simulated clock; the
planning table times one whole run serially (no other simulation in parallel).

Usage:
    python bench/sched_scale.py [--seeds 2] [--jobs 2] [--gpus 250,500,1000]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from multiprocessing import Pool

from sched_paper import MEASURED, NOISE_MODELS, Noisy, adaptive_table

from fleet.schedule import create_policy, noisy_scenario, scale, simulate
from fleet.schedule.compare import compare, summarize

GPU_COUNTS = (250, 500, 1000)


def _task(args):
    label, gpus, seed = args
    return label, compare(Noisy(scale, label), [gpus], ["fleet-adaptive"], [seed], MEASURED)


def run_grid(gpu_counts, seeds: int, jobs: int):
    tasks = [(label, g, s) for label in NOISE_MODELS for g in gpu_counts for s in range(seeds)]
    with Pool(jobs) as pool:
        results = pool.map(_task, tasks)
    rows = {label: [] for label in NOISE_MODELS}
    for label, part in results:
        rows[label].extend(part)
    return {label: summarize(r) for label, r in rows.items()}


def planning_table(gpus: int = 1000) -> str:
    """Every policy call of one fleet-adaptive run of 1,000 models on ``gpus`` GPUs, serially."""
    lines = ["| what (1,000 models) | calls | median ms | p90 ms | max ms | whole simulation (s) |",
             "|---|---:|---:|---:|---:|---:|"]
    for label in NOISE_MODELS:
        model, spread = NOISE_MODELS[label]
        scenario = noisy_scenario(scale(0), gpus, 0, spread, model)
        began = time.perf_counter()
        result = simulate(create_policy("fleet-adaptive"), scenario, MEASURED)
        wall = time.perf_counter() - began
        ms = sorted(1000 * p for p in result.planning_s)
        lines.append(f"| fleet-adaptive on {gpus} GPUs, {label} | {len(ms)} | {statistics.median(ms):.1f} "
                     f"| {ms[int(0.9 * (len(ms) - 1))]:.1f} | {ms[-1]:.0f} | {wall:.1f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--gpus", default=",".join(map(str, GPU_COUNTS)))
    args = parser.parse_args(argv)
    began = time.perf_counter()
    print("### Planning time at 1,000 models x 1,000 GPUs, measured serially\n")
    print(planning_table())
    gpu_counts = [int(g) for g in args.gpus.split(",")]
    print(f"\n### fleet-adaptive on 1,000 models against its targets ({args.seeds} seeds)\n")
    print(adaptive_table(run_grid(gpu_counts, args.seeds, args.jobs)))
    print(f"\n_bench wall time: {time.perf_counter() - began:.0f} s_")
    return 0


if __name__ == "__main__":
    sys.exit(main())
