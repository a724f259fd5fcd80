"""Scheduling at scale: planning time up to 10,000 models on 10,000 GPUs, and fleet-adaptive on
1,000 models against its targets; prints markdown.

The ``scale`` workload (``fleet.schedule.workloads.scale``: single-GPU rates log-uniform in
21-176 samples/s, 10-40 epochs, 4 GPUs per node), seeded.

* Planning (issue 46): each policy of ``--policies`` simulated alone, with exact estimates, at
  each size of ``--sizes`` (models x GPUs), one run at a time in a fresh process: the first
  policy call, the median, p90 and largest of every call that launched something (each timed
  and charged to the simulated clock), the whole simulation, and the process's peak RSS; and
  ``policy: auto``'s choice at each size (its time, and the candidates it skipped).
* Targets (issue 25): fleet-adaptive on 1,000 models, ``--gpus``, under the three noise models
  of ``bench/sched_paper.py`` (exact estimates, x U(0.7, 1.3), the stop-rule model).

Usage:
    python bench/sched_scale.py [--sizes 1000x1000,4000x4000,10000x10000,4000x1000]
        [--policies fleet-adaptive,fleet-g,baseline] [--seeds 2] [--jobs 2] [--gpus 250,500,1000]
        [--no-targets]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time
from multiprocessing import Pool

from sched_paper import MEASURED, NOISE_MODELS, Noisy, adaptive_table

from fleet.schedule import create_policy, scale, simulate
from fleet.schedule.choice import choose_policy
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


SIZES = "1000x1000,4000x4000,10000x10000,4000x1000"
PLANNED = "fleet-adaptive,fleet-g,baseline"


def _peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # KiB on Linux


def _planning_run(task):
    """One simulation of ``policy`` on ``models`` x ``gpus``, every call timed."""
    models, gpus, policy = task
    scenario = scale(0, models=models).scenario(gpus)
    began = time.perf_counter()
    result = simulate(create_policy(policy), scenario, MEASURED)
    return result.planning_s, time.perf_counter() - began, _peak_rss_gb()


def _choice_run(task):
    """``policy: auto``'s choice on ``models`` x ``gpus``, timed."""
    models, gpus = task
    scenario = scale(0, models=models).scenario(gpus)
    began = time.perf_counter()
    choice = choose_policy(create_policy, scenario)
    return choice, time.perf_counter() - began, _peak_rss_gb()


def _serially(function, tasks):
    """Each task in a fresh process of its own, one at a time (timings undisturbed, RSS its own)."""
    with Pool(1, maxtasksperchild=1) as pool:
        return pool.map(function, tasks, chunksize=1)


def planning_table(sizes, policies) -> str:
    """Every policy call of each policy alone at each size, and auto's choice there."""
    lines = ["| models x GPUs | policy | calls | first call ms | median ms | p90 ms | max ms | whole simulation s "
             "| peak RSS GB |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    tasks = [(models, gpus, policy) for models, gpus in sizes for policy in policies]
    for (models, gpus, policy), (planning, wall, rss) in zip(tasks, _serially(_planning_run, tasks)):
        ms = sorted(1000 * p for p in planning)
        lines.append(f"| {models:,} x {gpus:,} | {policy} | {len(ms)} | {1000 * planning[0]:.0f} "
                     f"| {statistics.median(ms):.1f} | {ms[int(0.9 * (len(ms) - 1))]:.1f} | {ms[-1]:.0f} | {wall:.1f} "
                     f"| {rss:.2f} |")
    lines += ["", "| models x GPUs | `policy: auto` chose | in s | skipped | peak RSS GB |", "|---|---|---:|---|---:|"]
    for (models, gpus), (choice, wall, rss) in zip(sizes, _serially(_choice_run, sizes)):
        lines.append(f"| {models:,} x {gpus:,} | {choice.name} | {wall:.1f} | {', '.join(choice.skipped) or '-'} "
                     f"| {rss:.2f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=SIZES, help="models x GPUs of the planning table (MxG,...; '' for none)")
    parser.add_argument("--policies", default=PLANNED)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--gpus", default=",".join(map(str, GPU_COUNTS)))
    parser.add_argument("--no-targets", action="store_true", help="the planning table only")
    args = parser.parse_args(argv)
    began = time.perf_counter()
    sizes = [tuple(int(n) for n in size.split("x")) for size in args.sizes.split(",") if size]
    if sizes:
        print("### Planning time, each run alone (exact estimates)\n")
        print(planning_table(sizes, args.policies.split(",")))
    if not args.no_targets:
        gpu_counts = [int(g) for g in args.gpus.split(",")]
        print(f"\n### fleet-adaptive on 1,000 models against its targets ({args.seeds} seeds)\n")
        print(adaptive_table(run_grid(gpu_counts, args.seeds, args.jobs)))
    print(f"\n_bench wall time: {time.perf_counter() - began:.0f} s_")
    return 0


if __name__ == "__main__":
    sys.exit(main())
