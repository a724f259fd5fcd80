"""fleet-adaptive over the workload family (issue 46); prints markdown for bench/RESULTS.md.

Each cell fixes the GPUs/models ratio (0.25, 0.5, 1, 2), the GPUs per node (4, 8) and the shape
(``issue``: issue 46's table; ``uniform``, ``bimodal``, ``heavy``: the epochs distribution, the
rest drawn) of :mod:`fleet.schedule.workload_family`; in each, ``--instances`` instances of
``--models`` models (seeds from ``REPORTING_SEEDS``, or ``TUNING_SEEDS`` with ``--tuning``) run
with exact epoch estimates and with each estimate x U(0.7, 1.3), fleet-adaptive beside FLEET-G
and Baseline. Checkpoints cost the ``Overheads`` defaults; planning is timed around every
policy call and charged to the simulated clock (under ``--jobs`` > 1 the calls share the cores).

Tables: (1) makespan / LB2 (the malleable bound on the true epochs), mean and worst over the
instances, per cell, against the targets (exact: <= 1.10 mean, <= 1.15 worst; x U(0.7, 1.3):
<= 1.15 mean); (2) fleet-adaptive's planning time per call: the first call and the median call,
mean over instances, and the slowest of each; (3) with ``--spot``, one instance of 1,000 models
per GPUs/models ratio (uniform shape, 4 GPUs per node, exact estimates).

With ``--oracle-longest 0.05,0.1`` the x U(0.7, 1.3) cells are run again with the longest
models' estimates exact (that share of the models, by their fastest training time on the true
epochs): where a cell then meets its target, what the policy lacked there is the longest
models' epochs, not a rule of its own.

Usage:
    python bench/sched_family.py [--instances 10] [--models 300] [--jobs 1] [--spot]
        [--shapes issue,uniform] [--ratios 0.5,1] [--gpus-per-node 4]    # a part of the grid
    python bench/sched_family.py --quick     # 2 instances per cell, a few minutes on one core

Any instance is rebuilt by ``fleet simulate --workload family --models N --seed S
--family-shape SHAPE --family-ratio R --family-gpus-per-node G``.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from dataclasses import dataclass
from multiprocessing import Pool

from sched_paper import MEASURED, NOISE, NOISE_MODELS

import numpy as np

from fleet.schedule import lower_bounds, noisy_scenario, simulate
from fleet.schedule.bounds import least_gpu_seconds, training_times
from fleet.schedule.planners import create_policy
from fleet.schedule.workload_family import REPORTING_SEEDS, SHAPES, TUNING_SEEDS, FamilyCell, family_instance

RATIOS = (0.25, 0.5, 1.0, 2.0)
GPUS_PER_NODE = (4, 8)
POLICIES = ("fleet-adaptive", "fleet-g", "baseline")
ESTIMATES = {label: NOISE_MODELS[label] for label in ("exact", f"x U({1 - NOISE:g},{1 + NOISE:g})")}
NOISY = f"x U({1 - NOISE:g},{1 + NOISE:g})"
TARGETS = {"exact": (1.10, 1.15), NOISY: (1.15, None)}
ORACLE = " longest {:g} % exact"
ADAPTIVE_OPTIONS: dict = {}  # --option: fleet-adaptive's options for this invocation (default: none)
GAP_PARTS = ("least by LB2", "training", "pacing", "overhead", "idle")
SPOT_MODELS = 1000
QUICK_INSTANCES = 2


@dataclass(frozen=True)
class Outcome:
    """One policy on one instance under one estimate model.

    Attributes:
        cell: the family cell.
        estimates: the ``ESTIMATES`` label.
        seed: the instance's seed.
        policy: the policy.
        ratio: makespan / LB2 (NaN where the policy failed).
        plan_first_ms: its first planning call, milliseconds.
        plan_median_ms: its median planning call, milliseconds.
        calls: planning calls that launched something.
        failure: the error the policy raised ("" when it ran).
        parts: the GPU-seconds of the run by what they did, over M x LB2 (they add up to
            ``ratio``; ``GAP_PARTS``), and first the least GPU-seconds the models need to end by LB2.
    """

    cell: FamilyCell
    estimates: str
    seed: int
    policy: str
    ratio: float
    plan_first_ms: float = float("nan")
    plan_median_ms: float = float("nan")
    calls: int = 0
    failure: str = ""
    parts: tuple[float, ...] = ()


def run_instance(task: tuple[FamilyCell, str, int, int]) -> list[Outcome]:
    """Every policy on instance ``seed`` of ``cell`` with ``models`` models, under ``estimates``."""
    cell, estimates, seed, models = task
    instance = family_instance(seed, models, cell)
    base, _, oracle = estimates.partition(" longest ")
    model, spread = ESTIMATES[base]
    scenario = noisy_scenario(instance.workload, instance.parameters.gpus, seed, spread, model)
    if oracle:
        scenario = longest_told_exactly(scenario, instance.parameters.gpus, float(oracle.split()[0]) / 100)
    gpus = instance.parameters.gpus
    lb2 = lower_bounds(scenario.rates, scenario.true_epochs, gpus).lb2
    least = sum(least_gpu_seconds(row, lb2) for row in training_times(scenario.rates, scenario.true_epochs, gpus))
    names = POLICIES[:1] if oracle else POLICIES
    return [_run_policy(name, scenario, (lb2, least / (gpus * lb2)), (cell, estimates, seed)) for name in names]


def longest_told_exactly(scenario, gpus: int, share: float):
    """``scenario`` with the estimates of its longest ``share`` of models (by their fastest
    time on the true epochs) made exact."""
    fastest = training_times(scenario.rates, scenario.true_epochs, gpus).min(axis=1)
    longest = set(np.argsort(-fastest)[:max(1, round(share * len(fastest)))].tolist())
    told = tuple(float(t) if i in longest else e
                 for i, (t, e) in enumerate(zip(scenario.true_epochs, scenario.epochs_estimate)))
    return dataclasses.replace(scenario, epochs_estimate=told)


def _run_policy(name: str, scenario, bound: tuple[float, float], where: tuple) -> Outcome:
    """``bound``: LB2 and the least GPU-seconds by it over M x LB2."""
    lb2, least = bound
    try:
        options = ADAPTIVE_OPTIONS if name == "fleet-adaptive" else {}
        result = simulate(create_policy(name, seed=where[2], **options), scenario, MEASURED)
    except RecursionError as exc:  # issue 46's crash at scale: reported in the table, not hidden
        return Outcome(*where, name, float("nan"), failure=f"RecursionError: {exc}")
    calls = [1000 * s for s in result.planning_s] or [0.0]
    spent = result.gpu_time
    parts = (least, *(x / (result.total_gpus * lb2) for x in (spent.training, spent.pacing, spent.overhead, spent.idle)))
    return Outcome(*where, name, result.makespan / lb2, calls[0], statistics.median(calls), len(result.planning_s),
                   parts=parts)


def cells(shapes=SHAPES, ratios=RATIOS, gpus_per_node=GPUS_PER_NODE) -> list[FamilyCell]:
    """The grid: shape x GPUs per node x GPUs/models ratio."""
    return [FamilyCell(shape, ratio, gpn) for shape in shapes for gpn in gpus_per_node for ratio in ratios]


def run_grid(grid: list[FamilyCell], seeds: range, models: int, jobs: int, estimates=tuple(ESTIMATES)) -> list[Outcome]:
    """Every (cell, estimates, seed), in parallel over ``jobs`` processes."""
    tasks = [(cell, label, seed, models) for cell in grid for label in estimates for seed in seeds]
    if jobs == 1:
        return [o for task in tasks for o in run_instance(task)]
    with Pool(jobs) as pool:
        return [o for part in pool.map(run_instance, tasks, chunksize=1) for o in part]


def _by(outcomes: list[Outcome]) -> dict[tuple, list[Outcome]]:
    groups: dict[tuple, list[Outcome]] = {}
    for o in outcomes:
        groups.setdefault((o.cell, o.estimates, o.policy), []).append(o)
    return groups


def _mean_worst(group: list[Outcome]) -> str:
    ratios = [o.ratio for o in group if not o.failure]
    failed = len(group) - len(ratios)
    text = f"{statistics.mean(ratios):.3f} ({max(ratios):.3f})" if ratios else "-"
    return text + (f" **{failed} failed**" if failed else "")


def _verdict(group: list[Outcome], estimates: str) -> str:
    ratios = [o.ratio for o in group]
    mean_target, worst_target = TARGETS[estimates.partition(" longest ")[0]]
    if any(o.failure for o in group):
        return "**failed**"
    met = statistics.mean(ratios) <= mean_target and (worst_target is None or max(ratios) <= worst_target)
    return "met" if met else "**missed**"


def ratio_table(outcomes: list[Outcome]) -> str:
    """Makespan / LB2, mean (worst) over instances, per cell and estimate model."""
    groups = _by(outcomes)
    lines = ["| shape | GPUs/node | GPUs/models | estimates | fleet-adaptive | target | fleet-g | baseline |",
             "|---|---:|---:|---|---:|---|---:|---:|"]
    for cell in dict.fromkeys(o.cell for o in outcomes):
        for label in ESTIMATES:
            adaptive = groups.get((cell, label, "fleet-adaptive"))
            if not adaptive:
                continue
            others = [_mean_worst(groups[(cell, label, name)]) for name in POLICIES[1:]]
            lines.append(f"| {cell.shape} | {cell.gpus_per_node} | {cell.gpus_ratio:g} | {label} "
                         f"| {_mean_worst(adaptive)} | {_verdict(adaptive, label)} | {' | '.join(others)} |")
    return "\n".join(lines)


def oracle_table(outcomes: list[Outcome], labels: list[str]) -> str:
    """fleet-adaptive with x U(0.7, 1.3) estimates against the same with the longest models'
    estimates exact, in the cells that miss the target without them."""
    groups = _by(outcomes)
    lines = [f"| shape | GPUs/node | GPUs/models | {NOISY} | {' | '.join(labels)} |",
             f"|---|---:|---:|---:|{'---:|' * len(labels)}"]
    for cell in dict.fromkeys(o.cell for o in outcomes):
        noisy = groups.get((cell, NOISY, "fleet-adaptive"))
        if not noisy or _verdict(noisy, NOISY) == "met":
            continue
        told = [groups[(cell, label, "fleet-adaptive")] for label in labels]
        lines.append(f"| {cell.shape} | {cell.gpus_per_node} | {cell.gpus_ratio:g} | {_mean_worst(noisy)} | "
                     + " | ".join(f"{_mean_worst(g)} {_verdict(g, label)}" for g, label in zip(told, labels)) + " |")
    return "\n".join(lines)


def gap_table(outcomes: list[Outcome]) -> str:
    """Where fleet-adaptive's GPU-seconds went in the cells that miss the exact target, over
    M x LB2 (means over the instances): what the ratio is made of beyond the least GPU-seconds
    that end every model by LB2."""
    groups = _by(outcomes)
    lines = [f"| shape | GPUs/node | GPUs/models | ratio | {' | '.join(GAP_PARTS)} |",
             f"|---|---:|---:|---:|{'---:|' * len(GAP_PARTS)}"]
    for cell in dict.fromkeys(o.cell for o in outcomes):
        runs = groups.get((cell, "exact", "fleet-adaptive"))
        if not runs or _verdict(runs, "exact") == "met":
            continue
        means = [statistics.mean(o.parts[k] for o in runs) for k in range(len(GAP_PARTS))]
        lines.append(f"| {cell.shape} | {cell.gpus_per_node} | {cell.gpus_ratio:g} "
                     f"| {statistics.mean(o.ratio for o in runs):.3f} | {' | '.join(f'{m:.3f}' for m in means)} |")
    return "\n".join(lines)


def planning_table(outcomes: list[Outcome]) -> str:
    """fleet-adaptive's planning per call, by GPUs/models ratio (all shapes and GPUs per node)."""
    runs = [o for o in outcomes if o.policy == "fleet-adaptive" and not o.failure]
    lines = ["| GPUs/models | runs | calls per run | first call ms mean (max) | median call ms mean (max) |",
             "|---:|---:|---:|---:|---:|"]
    for ratio in sorted({o.cell.gpus_ratio for o in runs}):
        group = [o for o in runs if o.cell.gpus_ratio == ratio]
        first, median = [o.plan_first_ms for o in group], [o.plan_median_ms for o in group]
        lines.append(f"| {ratio:g} | {len(group)} | {statistics.mean(o.calls for o in group):.0f} "
                     f"| {statistics.mean(first):.1f} ({max(first):.1f}) "
                     f"| {statistics.mean(median):.2f} ({max(median):.2f}) |")
    return "\n".join(lines)


def summary_line(outcomes: list[Outcome]) -> str:
    """How many cells meet their targets, per estimate model."""
    groups = _by(outcomes)
    parts = []
    for label in ESTIMATES:
        verdicts = [_verdict(g, est) for (cell, est, name), g in groups.items()
                    if est == label and name == "fleet-adaptive"]
        parts.append(f"{label}: {verdicts.count('met')} of {len(verdicts)} cells met")
    return "; ".join(parts)


def spot_table(seed: int, jobs: int) -> str:
    """One 1,000-model instance per GPUs/models ratio (uniform shape, 4 GPUs per node, exact)."""
    exact = run_grid(cells(("uniform",), RATIOS, (4,)), range(seed, seed + 1), SPOT_MODELS, jobs, ("exact",))
    lines = [f"| GPUs/models | GPUs | {' | '.join(POLICIES)} | fleet-adaptive first / median call ms |",
             f"|---:|---:|{'---:|' * len(POLICIES)}---:|"]
    for ratio in RATIOS:
        row = {o.policy: o for o in exact if o.cell.gpus_ratio == ratio}
        cells_ = [o.failure.split(":")[0] if o.failure else f"{o.ratio:.3f}" for o in (row[p] for p in POLICIES)]
        fa = row["fleet-adaptive"]
        lines.append(f"| {ratio:g} | {round(ratio * SPOT_MODELS)} | {' | '.join(cells_)} "
                     f"| {fa.plan_first_ms:.0f} / {fa.plan_median_ms:.2f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instances", type=int, default=10, help="instances per cell (default 10)")
    parser.add_argument("--models", type=int, default=300, help="models per instance (default 300)")
    parser.add_argument("--jobs", type=int, default=1, help="processes (default 1)")
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_INSTANCES} instances per cell")
    parser.add_argument("--tuning", action="store_true", help="draw from TUNING_SEEDS instead of REPORTING_SEEDS")
    parser.add_argument("--spot", action="store_true", help=f"also one {SPOT_MODELS:,}-model instance per ratio")
    parser.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated shapes (default: all)")
    parser.add_argument("--ratios", default=",".join(f"{r:g}" for r in RATIOS), help="GPUs/models ratios")
    parser.add_argument("--gpus-per-node", default=",".join(map(str, GPUS_PER_NODE)), help="GPUs per node")
    parser.add_argument("--oracle-longest", default="", metavar="SHARES",
                        help="also x U(0.7,1.3) with the longest models' estimates exact: comma-separated "
                             "shares of the models, e.g. 0.05,0.1")
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                        help="an option of fleet-adaptive (docs/spec.md), e.g. min_members=1; repeatable")
    parser.add_argument("--noisy-only", action="store_true", help=f"only the {NOISY} estimates (and the oracles)")
    args = parser.parse_args(argv)
    instances = QUICK_INSTANCES if args.quick else args.instances
    pool = TUNING_SEEDS if args.tuning else REPORTING_SEEDS
    seeds = range(pool.start, pool.start + instances)
    began = time.perf_counter()
    grid = cells(tuple(args.shapes.split(",")), tuple(float(r) for r in args.ratios.split(",")),
                 tuple(int(g) for g in args.gpus_per_node.split(",")))
    ADAPTIVE_OPTIONS.update((k, float(v)) for k, _, v in (o.partition("=") for o in args.option))
    oracles = [NOISY + ORACLE.format(100 * float(x)) for x in args.oracle_longest.split(",") if x]
    estimates = ((NOISY,) if args.noisy_only else tuple(ESTIMATES)) + tuple(oracles)
    outcomes = run_grid(grid, seeds, args.models, args.jobs, estimates)
    print(f"### fleet-adaptive over the workload family: makespan / LB2, mean (worst) of {instances} instances "
          f"of {args.models} models, seeds {seeds.start}-{seeds.stop - 1}\n")
    print(ratio_table(outcomes))
    print(f"\n{summary_line(outcomes)}")
    if not args.noisy_only:
        print("\n### Where fleet-adaptive's GPU-seconds went in the exact cells that miss, over M x LB2\n")
        print(gap_table(outcomes))
    if oracles:
        print(f"\n### What fleet-adaptive lacked where {NOISY} misses: the longest models' epochs told exactly\n")
        print(oracle_table(outcomes, oracles))
    print(f"\n### fleet-adaptive's planning time per call ({args.jobs} job(s))\n")
    print(planning_table(outcomes))
    if args.spot:
        print(f"\n### Spot check: {SPOT_MODELS:,} models, uniform shape, 4 GPUs/node, exact estimates, "
              f"seed {seeds.start}\n")
        print(spot_table(seeds.start, args.jobs))
    print(f"\n_bench wall time: {time.perf_counter() - began:.0f} s_")
    return 0


if __name__ == "__main__":
    sys.exit(main())
