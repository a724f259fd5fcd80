"""Learning over groups (issue 47): `grouped` against group-task (GTP), model-task (MTP) and
group-parallel (DP).

(1) The simulator: the paper-like workload's first 4 models as configurations, each trained on
each of 100 or 1,000 groups of Zipf-skewed sizes (exponents 0.5, 1.0, 1.5) splitting its
epoch, on 4 to 64 nodes of 4 GPUs, exact epoch estimates. Decoding is priced: each node's
preprocessors decode 4 x a mean configuration's one-GPU rate (a node's four GPUs each on a
stream of its own at that rate), a model that decodes its own data (model-task) does so at 2 x
that rate between its steps. Each cell: every policy's makespan over the grouped lower bound
(`fleet.schedule.group_workload.grouped_bound`: the total one-GPU work over the GPUs, or the
longest (group, configuration) at its fastest GPU count), the best baseline and grouped over it.

(2) ``--runtime``: real runs on virtual nodes (2 nodes x 2 trainer slots + 1 preprocessor each,
CPU), a synthetic HDF5 data set of 24 Zipf(1.0) groups, 2 MLP configurations per group, one
`fleet run` per policy in one invocation: wall time, makespan, samples decoded and the mean of
each group's best validation accuracy; beside them the outside peer, a plain per-group job array
(each (group, configuration) of grouped's resolved spec a `plain_loop.py` process with its own
DataLoader, 4 at a time).

Usage:
    python bench/groups.py [--groups 100,1000] [--skews 0.5,1,1.5] [--nodes 4,8,16,32,64] [--jobs 2]
    python bench/groups.py --runtime [--work /tmp/groups-runtime]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from multiprocessing import Pool
from pathlib import Path

import yaml

from _harness import fleet, fleet_run, run_to_end
from fleet.schedule import create_policy, paper100, simulate
from fleet.schedule.group_workload import grouped_bound, grouped_scenario
from fleet.schedule.planners import GROUP_POLICIES
from fleet.spec import load_spec

CONFIGURATIONS = 4
BASELINES = ("group-task", "model-task", "group-parallel")
FLEET_TIMEOUT_S = 1800  # seconds one `fleet` command of --runtime may take
PLAIN_LOOP = Path(__file__).resolve().parent / "plain_loop.py"
ARRAY_SLOTS = 4  # the job array's tasks at a time (the outside peer)


def cell(task: tuple[int, float, int]) -> tuple[tuple[int, float, int], dict[str, float]]:
    """Every policy's makespan over the bound on one (groups, skew, nodes)."""
    groups, skew, nodes = task
    workload = paper100(0)
    mean_rate = statistics.mean(p.rates[0] for p in workload.rates.models[:CONFIGURATIONS])
    scenario = grouped_scenario(workload, groups, skew, 4 * nodes, CONFIGURATIONS,
                                decode_per_node=4 * mean_rate, own_decode=2 * mean_rate)
    bound = grouped_bound(scenario)
    return task, {p: simulate(create_policy(p), scenario).makespan / bound for p in GROUP_POLICIES}


def table(groups: list[int], skews: list[float], nodes: list[int], jobs: int) -> str:
    tasks = [(g, s, k) for g in groups for s in skews for k in nodes]
    with Pool(jobs) as pool:
        cells = dict(pool.map(cell, tasks))
    lines = ["| groups | Zipf | nodes (GPUs) | grouped /LB | group-task /LB | model-task /LB | group-parallel /LB "
             "| best baseline | grouped / best |", "|---:|---:|---:|---:|---:|---:|---:|---|---:|"]
    for task in tasks:
        row = cells[task]
        best = min(BASELINES, key=lambda p: row[p])
        lines.append(f"| {task[0]} | {task[1]:g} | {task[2]} ({4 * task[2]}) | "
                     + " | ".join(f"{row[p]:.2f}" for p in GROUP_POLICIES)
                     + f" | {best} | {row['grouped'] / row[best]:.2f} |")
    return "\n".join(lines)


def runtime_spec(work: Path, data: Path, policy: str) -> Path:
    doc = {
        "name": f"groups-{policy}", "seed": 3,
        "data": {"source": "hdf5", "path": str(data), "image_size": 16, "val_fraction": 0.2,
                 "group_by": {"dataset": "groups"}, "min_group_samples": 20},
        "models": [{"family": "mlp", "name": "small", "params": {"hidden": [32]}},
                   {"family": "mlp", "name": "wide", "params": {"hidden": [128]}}],
        "train": {"batch_size": 32, "max_epochs": 3, "optimizer": "sgd", "lr": 0.05},
        "scheduler": {"policy": policy, "profile": False},
        "cluster": {"nodes": 2, "gpus_per_node": 2, "preprocessors_per_node": 1, "virtual_nodes": True,
                    "device": "cpu"},
        "runtime": {"timeout_s": 300},
    }
    path = work / f"{policy}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def best_per_group(results: dict) -> float:
    """The mean over groups of the best validation accuracy of the group's configurations."""
    best: dict[str, float] = {}
    for model in results["models"]:
        group = results["groups"][model["id"]]
        best[group] = max(best.get(group, 0.0), model.get("best_val_accuracy") or 0.0)
    return statistics.mean(best.values())


def job_array(resolved_spec: Path, work: Path) -> tuple[float, int, float]:
    """The outside peer: each (group, configuration) of a grouped run's resolved spec trained
    by `plain_loop.py` in a process of its own (its own DataLoader decoding its group's
    samples), ARRAY_SLOTS at a time; wall seconds, samples decoded, mean best val accuracy per
    group."""
    models = load_spec(str(resolved_spec)).models
    work.mkdir(parents=True, exist_ok=True)

    def one(index: int) -> None:
        out = work / f"{index}.json"
        run_to_end([sys.executable, str(PLAIN_LOOP), str(resolved_spec), "--model", str(index), "--seed",
                    str(models[index].seed), "--threads", "1", "--json", str(out)], f"job array task {index}",
                   FLEET_TIMEOUT_S)

    started = time.perf_counter()
    with ThreadPoolExecutor(ARRAY_SLOTS) as pool:
        list(pool.map(one, range(len(models))))
    wall = time.perf_counter() - started
    trained = [json.loads((work / f"{i}.json").read_text()) for i in range(len(models))]
    groups = {m.id: m.group for m in models}
    best: dict[str, float] = {}
    for model in trained:
        best[groups[model["id"]]] = max(best.get(groups[model["id"]], 0.0), model["best_val_accuracy"])
    return wall, sum(m["samples_decoded"] for m in trained), statistics.mean(best.values())


def runtime_table(work: Path, samples: int) -> str:
    work.mkdir(parents=True, exist_ok=True)
    data = work / "groups.h5"
    if not data.exists():
        fleet("data", "make", "synthetic", "--format", "hdf5", "--out", str(data), "--samples", str(samples),
              "--image-size", "16", "--classes", "4", "--groups", "24", "--group-skew", "1.0", "--quiet",
              timeout=FLEET_TIMEOUT_S)
    lines = ["| policy | wall | makespan | samples decoded | mean best val accuracy per group |", "|---|---:|---:|---:|---:|"]
    for policy in GROUP_POLICIES:
        shutil.rmtree(work / policy, ignore_errors=True)  # a fresh run, not a resumed one
        run = fleet_run(runtime_spec(work, data, policy), work / policy, FLEET_TIMEOUT_S)
        res = run.results
        lines.append(f"| {policy} | {run.wall_s:.1f} s | {res['makespan_s']:.1f} s | {res['samples_decoded']:,} "
                     f"| {best_per_group(res):.3f} |")
    wall, decoded, accuracy = job_array(work / "grouped" / "spec.yaml", work / "job-array")
    lines.append(f"| job array, plain PyTorch, {ARRAY_SLOTS} at a time | {wall:.1f} s | - | {decoded:,} | {accuracy:.3f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", default="100,1000")
    parser.add_argument("--skews", default="0.5,1,1.5")
    parser.add_argument("--nodes", default="4,8,16,32,64")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--runtime", action="store_true", help="real runs on virtual nodes instead")
    parser.add_argument("--samples", type=int, default=4800, help="--runtime: samples of the synthetic data set")
    parser.add_argument("--work", default="/tmp/groups-runtime")
    args = parser.parse_args()
    if args.runtime:
        print(f"2 MLP configurations x 24 Zipf(1.0) groups of {args.samples} 16x16 samples, 3 epochs; 2 virtual "
              "nodes x 2 CPU trainer slots + 1 preprocessor each")
        print(runtime_table(Path(args.work), args.samples))
        return
    print(table([int(g) for g in args.groups.split(",")], [float(s) for s in args.skews.split(",")],
                [int(k) for k in args.nodes.split(",")], args.jobs))


if __name__ == "__main__":
    main()
