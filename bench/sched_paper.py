"""Scheduling benchmark in the FLEET paper's setting; prints markdown for bench/RESULTS.md.

100 ResNet/DenseNet-like models (``paper100``: 21-176 samples/s on one GPU, Caltech-256
epochs of 30,606 samples, 4 GPUs per node), 20..160 GPUs in steps of 20, several seeds.
Checkpoint and restore costs come from each model's size (``fleet.schedule.Overheads``
defaults); planning time is measured around every policy call (``time.perf_counter``) and
charged to the simulated clock.

Usage:
    python bench/sched_paper.py [--seeds 5] [--jobs 2] [--chart bench/sched_paper.png]

Tables: (1) the four paper policies and fleet-adaptive with the profile's epochs as
estimates; (2) fleet-adaptive under three noise models (``fleet.schedule.noise``): exact
estimates, each x U(0.7, 1.3), and the stop-rule model (true epochs from each model's
learning curve, reported every epoch; estimates x U(0.7, 1.3)), all seeded; (3) planning time
for 100 models on 160 GPUs, measured serially; (4) checkpoint cost per FLEET-G round;
(5) FLEET-G and fleet-adaptive with three times heavier checkpoints.
``bench/sched_scale.py`` is the same table (2) for 1,000 models on up to 1,000 GPUs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from multiprocessing import Pool

import numpy as np

from fleet.schedule import Overheads, create_flotilla, create_policy, noisy_scenario, paper100, place, simulate
from fleet.schedule.compare import compare, summarize

GPU_COUNTS = tuple(range(20, 161, 20))
POLICIES = ("baseline", "homogeneous", "fleet-l", "fleet-g", "fleet-adaptive")
NOISE = 0.3
NOISE_MODELS = {"exact": ("uniform", 0.0), "x U(0.7,1.3)": ("uniform", NOISE), "stop-rule": ("stop-rule", NOISE)}
TARGET_MEAN, TARGET_WORST, TARGET_DECODED = 1.10, 1.15, 0.25
PAPER = {"fleet-g vs baseline": "1.12-1.92x", "fleet-g vs homogeneous": "1.23-1.97x"}
MEASURED = Overheads(planning_s=None)


def exact(gpus: int, seed: int):
    return paper100(seed).scenario(gpus)


class Noisy:
    """``(gpus, seed) -> Scenario`` of a workload under one noise model (picklable for Pool)."""

    def __init__(self, make, label: str):
        self.make, (self.model, self.spread) = make, NOISE_MODELS[label]

    def __call__(self, gpus: int, seed: int):
        return noisy_scenario(self.make(seed), gpus, seed, self.spread, self.model)


def _task(args):
    table, gpus, seed = args
    if table == "all":
        return compare(exact, [gpus], POLICIES, [seed], MEASURED)
    return compare(Noisy(paper100, table), [gpus], ["fleet-adaptive"], [seed], MEASURED)


def run_grid(seeds: int, jobs: int):
    tables = ["all", *(label for label in NOISE_MODELS if label != "exact")]
    tasks = [(t, g, s) for t in tables for g in GPU_COUNTS for s in range(seeds)]
    with Pool(jobs) as pool:
        results = pool.map(_task, tasks)
    rows = {t: [] for t in tables}
    for (table, _, _), part in zip(tasks, results):
        rows[table].extend(part)
    summaries = {t: summarize(r) for t, r in rows.items()}
    summaries["exact"] = [s for s in summaries["all"] if s["policy"] == "fleet-adaptive"]
    return summaries


def main_table(summary) -> str:
    lines = [
        "| GPUs | policy | makespan (h) | makespan/LB2 mean (max) | makespan/LB1 | vs Baseline | vs Homogeneous "
        "| rounds | decoded vs Baseline | plan ms/call mean (max) |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in summary:
        lines.append(
            f"| {s['gpus']} | {s['policy']} | {s['makespan_s'] / 3600:.1f} | {s['makespan_lb2']:.3f} "
            f"({s['makespan_lb2_max']:.3f}) | {s['makespan_lb1']:.3f} | {s['speedup_baseline']:.2f}x "
            f"| {s['speedup_homogeneous']:.2f}x | {s['rounds']:.1f} | {s['decoded_vs_baseline']:.3f} "
            f"| {s['plan_ms']:.1f} ({s['plan_ms_max']:.1f}) |"
        )
    return "\n".join(lines)


def adaptive_table(summaries) -> str:
    """fleet-adaptive per GPU count and noise model against its targets."""
    lines = [
        f"| GPUs | estimates | makespan/LB2 mean | worst over seeds | target <= {TARGET_MEAN:.2f} mean, "
        f"<= {TARGET_WORST:.2f} worst | decoded vs Baseline (max) | target <= {TARGET_DECODED:.2f} | checkpoints |",
        "|---:|---|---:|---:|---|---:|---|---:|",
    ]
    for label in NOISE_MODELS:
        for s in (s for s in summaries[label] if s["policy"] == "fleet-adaptive"):
            ok_time = "met" if s["makespan_lb2"] <= TARGET_MEAN and s["makespan_lb2_max"] <= TARGET_WORST else "**missed**"
            ok_dec = "met" if s["decoded_vs_baseline_max"] <= TARGET_DECODED else "**missed**"
            lines.append(
                f"| {s['gpus']} | {label} | {s['makespan_lb2']:.3f} | {s['makespan_lb2_max']:.3f} | {ok_time} "
                f"| {s['decoded_vs_baseline']:.3f} ({s['decoded_vs_baseline_max']:.3f}) | {ok_dec} "
                f"| {s['checkpoints']:.0f} |"
            )
    return "\n".join(lines)


def trend_table(summary) -> str:
    by = {(s["gpus"], s["policy"]): s for s in summary}
    lines = ["| GPUs | FLEET-G vs Baseline | FLEET-G vs Homogeneous | FLEET-L vs Baseline | fleet-adaptive vs FLEET-G |",
             "|---:|---:|---:|---:|---:|"]
    for g in GPU_COUNTS:
        fg, fl, fa = by[(g, "fleet-g")], by[(g, "fleet-l")], by[(g, "fleet-adaptive")]
        lines.append(f"| {g} | {fg['speedup_baseline']:.2f}x | {fg['speedup_homogeneous']:.2f}x "
                     f"| {fl['speedup_baseline']:.2f}x | {fg['makespan_s'] / fa['makespan_s']:.2f}x |")
    lines.append(f"| paper (abstract, 20-160 GPUs) | {PAPER['fleet-g vs baseline']} | "
                 f"{PAPER['fleet-g vs homogeneous']} | - | - |")
    return "\n".join(lines)


def planning_table(repeats: int = 20) -> str:
    """Serial timing of one planning step for 100 models on 160 GPUs."""
    workload = paper100(0)
    rates, ids = workload.rates, list(workload.rates.ids)
    flotilla_ms, place_ms = [], []
    for _ in range(repeats):
        began = time.perf_counter()
        flotilla = create_flotilla(rates, ids, 160)
        middle = time.perf_counter()
        place([m.gpus for m in flotilla.members], range(160), rates.gpus_per_node)
        flotilla_ms.append(1000 * (middle - began))
        place_ms.append(1000 * (time.perf_counter() - middle))
    calls = {}
    for name in ("fleet-g", "fleet-adaptive"):
        result = simulate(create_policy(name), workload.scenario(160), MEASURED)
        calls[name] = [1000 * p for p in result.planning_s]
    lines = ["| what (100 models, 160 GPUs) | median ms | max ms |", "|---|---:|---:|"]
    lines.append(f"| Alg. 2 create_flotilla (first round) | {statistics.median(flotilla_ms):.1f} | {max(flotilla_ms):.1f} |")
    lines.append(f"| Alg. 3/4 place (first round) | {statistics.median(place_ms):.1f} | {max(place_ms):.1f} |")
    for name, ms in calls.items():
        lines.append(f"| {name}: every planning call of a run ({len(ms)} calls) | {statistics.median(ms):.1f} | {max(ms):.1f} |")
    return "\n".join(lines)


def checkpoint_table(seeds: int) -> str:
    """Checkpoint + restore time per FLEET-G re-flotillation, relative to its round."""
    lines = ["| GPUs | rounds | mean round (s) | checkpoint+restore per round (s) | share of round time "
             "(all rounds) | median share per round |",
             "|---:|---:|---:|---:|---:|---:|"]
    for gpus in (20, 80, 160):
        shares, lengths, costs, rounds = [], [], [], []
        for seed in range(seeds):
            result = simulate(create_policy("fleet-g"), paper100(seed).scenario(gpus), Overheads())
            rounds.append(result.rounds)
            for rnd in result.timeline.rounds[:-1]:
                members = [m for m in result.timeline.members if m.round == rnd.index]
                nxt = [m for m in result.timeline.members if m.round == rnd.index + 1]
                ckpt = max((m.released - m.end for m in members), default=0.0)
                restore = max((m.start - m.launched for m in nxt), default=0.0)
                lengths.append(rnd.end - rnd.start)
                costs.append(ckpt + restore)
                shares.append((ckpt + restore) / (rnd.end - rnd.start))
        lines.append(f"| {gpus} | {np.mean(rounds):.1f} | {np.mean(lengths):.0f} | {np.mean(costs):.1f} "
                     f"| {100 * sum(costs) / sum(lengths):.1f} % | {100 * np.median(shares):.1f} % |")
    return "\n".join(lines)


HEAVY = Overheads(latency_s=15.0, bandwidth=200e6, planning_s=0.0)


def _heavy_task(args):
    gpus, seed = args
    return compare(exact, [gpus], ["fleet-g", "fleet-adaptive"], [seed], HEAVY)


def heavy_table(seeds: int, jobs: int) -> str:
    """The same runs with checkpoints three times as expensive (15 s + 3 x bytes at 200 MB/s)."""
    tasks = [(g, s) for g in (20, 80, 160) for s in range(seeds)]
    with Pool(jobs) as pool:
        rows = [r for part in pool.map(_heavy_task, tasks) for r in part]
    lines = ["| GPUs | policy | makespan/LB2 mean (max) | vs Baseline |", "|---:|---|---:|---:|"]
    for s in summarize(rows):
        lines.append(f"| {s['gpus']} | {s['policy']} | {s['makespan_lb2']:.3f} ({s['makespan_lb2_max']:.3f}) "
                     f"| {s['speedup_baseline']:.2f}x |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--chart", help="also write the Fig. 5/6-style PNG here")
    args = parser.parse_args(argv)
    began = time.perf_counter()
    summaries = run_grid(args.seeds, args.jobs)
    exact_summary = summaries["all"]
    print(f"### All policies (mean of {args.seeds} seeds; estimates = the profile's epochs)\n")
    print(main_table(exact_summary))
    print("\n### The paper's trend, side by side\n")
    print(trend_table(exact_summary))
    print(f"\n### fleet-adaptive against its targets ({args.seeds} seeds)\n")
    print(adaptive_table(summaries))
    print("\n### Planning time, measured serially on this machine\n")
    print(planning_table())
    print("\n### Checkpoint cost of a FLEET-G re-flotillation (default Overheads)\n")
    print(checkpoint_table(args.seeds))
    print("\n### Sensitivity: checkpoint and restore three times as expensive\n")
    print(heavy_table(args.seeds, args.jobs))
    print(f"\n_bench wall time: {time.perf_counter() - began:.0f} s_")
    if args.chart:
        from fleet.report.schedule_charts import write_schedule_charts

        write_schedule_charts(exact_summary, args.chart, title="paper100, mean of seeds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
