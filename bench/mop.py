"""Model hopping over partitioned data: `fleet-hop` against `mop` (Cerebro) in the simulator.

The paper-like workload (``paper100``: 100 ResNet/DenseNet variants, 4 GPUs per node) on 8 to
64 nodes with one partition per node, as Cerebro runs, seeded; exact epoch estimates and
estimates off by U(0.7, 1.3). Each row: the mean makespan of both policies, their ratio, the
makespan over the lower bound LB2 (which ignores partitions and hops, so no hopping policy
reaches 1.0), the hops, and the bytes the hops move between nodes (a checkpoint of
``state_factor`` x the parameter bytes written by one node and read by the next), and the
samples decoded relative to one decode per model-epoch. Costs: the simulator's defaults
(``Overheads``: 5 s + 3 x parameter bytes at 1 GB/s per checkpoint and per restore).

The runtime part of issue 24's bench (4 virtual nodes on the emulated device, against the
simulator's prediction) comes with the runtime's partitioned data.

Usage:
    python bench/mop.py [--seeds 3] [--jobs 2] [--nodes 8,16,32,64]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import replace
from multiprocessing import Pool

from fleet.schedule import Overheads, create_policy, lower_bounds, noisy_estimates, paper100, simulate
from fleet.schedule.simulator import Outcome

NODES = (8, 16, 32, 64)
ESTIMATES = {"exact": 0.0, "x U(0.7, 1.3)": 0.3}
COSTS = Overheads()


def _run(task):
    nodes, label, seed, policy = task
    workload = paper100(seed)
    scenario = workload.scenario(4 * nodes)
    spread = ESTIMATES[label]
    if spread:
        scenario = replace(scenario, epochs_estimate=noisy_estimates(workload.true_epochs, seed, spread))
    n = scenario.rates.samples_per_epoch
    scenario = replace(scenario, partition_sizes=(n / nodes,) * nodes)
    result = simulate(create_policy(policy, seed=seed), scenario, COSTS)
    sizes = {p.id: p.param_bytes or COSTS.default_param_bytes for p in scenario.rates.models}
    moved = sum(COSTS.state_factor * sizes[r.model] for r in result.timeline.members if r.outcome is Outcome.HOPPED)
    lb2 = lower_bounds(scenario.rates, scenario.true_epochs, 4 * nodes).lb2
    decoded = result.samples_decoded / (sum(scenario.true_epochs) * n)
    return (nodes, label, policy), (result.makespan, result.makespan / lb2, result.hops, moved, decoded)


def table(nodes, seeds: int, jobs: int) -> str:
    tasks = [(k, label, s, p) for k in nodes for label in ESTIMATES for s in range(seeds) for p in ("mop", "fleet-hop")]
    with Pool(jobs) as pool:
        results = pool.map(_run, tasks)
    grouped: dict[tuple, list] = {}
    for key, value in results:
        grouped.setdefault(key, []).append(value)

    def mean(key, i):
        return statistics.mean(v[i] for v in grouped[key])

    lines = ["| nodes (GPUs) | estimates | mop makespan | fleet-hop makespan | fleet-hop vs mop | mop /LB2 "
             "| fleet-hop /LB2 | hops | moved by hops (mop / fleet-hop) | decoded (mop / fleet-hop) |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for k in nodes:
        for label in ESTIMATES:
            mop, hop = (k, label, "mop"), (k, label, "fleet-hop")
            speedup = statistics.mean(m[0] / h[0] for m, h in zip(grouped[mop], grouped[hop]))
            lines.append(
                f"| {k} ({4 * k}) | {label} | {mean(mop, 0) / 3600:.2f} h | {mean(hop, 0) / 3600:.2f} h "
                f"| {speedup:.2f}x | {mean(mop, 1):.2f} | {mean(hop, 1):.2f} | {mean(hop, 2):.0f} "
                f"| {mean(mop, 3) / 1e12:.2f} / {mean(hop, 3) / 1e12:.2f} TB "
                f"| {mean(mop, 4):.2f} / {mean(hop, 4):.2f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--nodes", default=",".join(map(str, NODES)))
    args = parser.parse_args(argv)
    nodes = [int(k) for k in args.nodes.split(",")]
    print(f"paper100, one partition per node, {args.seeds} seeds, costs {COSTS}")
    print(table(nodes, args.seeds, args.jobs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
