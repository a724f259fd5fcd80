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
`fleet run` per policy and, beside them, the outside peer: a plain per-group job array (each
(group, configuration) of grouped's resolved spec a `plain_loop.py` process with its own
DataLoader, 4 at a time). Each of `--runs` rounds runs them all, the order rotated from one
round to the next (on a shared box the load drifts, and the first run of an invocation is not
the last's peer); run directories stay under `--work`, one folder per round. Per policy, the
medians over rounds of: wall time, makespan, CPU seconds (user + system of the command and
every process it started: what it cost the machine, whatever the load), samples decoded, the
groups whose training samples were decoded once per epoch pass (a group's streams decoded no
more than its models' most epochs over its samples, within half a pass: read from the run's
`member_start` and `stream_end` events) and the mean of each group's best validation accuracy.

Usage:
    python bench/groups.py [--groups 100,1000] [--skews 0.5,1,1.5] [--nodes 4,8,16,32,64] [--jobs 2]
    python bench/groups.py --runtime [--samples 4800] [--runs 1] [--work /tmp/groups-runtime]
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import Pool
from pathlib import Path

import yaml

from _harness import at_least, fleet, fleet_run, read_results, run_to_end
from fleet.runtime.events import read_events
from fleet.schedule import create_policy, paper100, simulate
from fleet.schedule.group_workload import grouped_bound, grouped_scenario
from fleet.schedule.planners import GROUP_POLICIES
from fleet.spec import load_spec

CONFIGURATIONS = 4
BASELINES = ("group-task", "model-task", "group-parallel")
FLEET_TIMEOUT_S = 1800  # seconds one `fleet` command of --runtime may take
PLAIN_LOOP = Path(__file__).resolve().parent / "plain_loop.py"
ARRAY_SLOTS = 4  # the job array's tasks at a time (the outside peer)
JOB_ARRAY = "job-array"
RUN_ORDER = (*GROUP_POLICIES, JOB_ARRAY)  # --runtime's runs of one round, before rotation


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


@dataclass(frozen=True)
class Measured:
    """One run of a policy (or of the job array) in one round."""

    wall_s: float
    cpu_s: float  # user + system seconds of the command and every process it started
    makespan_s: float | None  # None for the job array
    decoded: int  # training samples decoded
    decoded_once: int  # groups whose training samples were decoded once per epoch pass
    accuracy: float  # the mean over groups of the best validation accuracy of a group's configurations
    per_group: Mapping[str, float] = field(default_factory=dict, compare=False)  # that best, by group


FIGURES = ("wall_s", "cpu_s", "makespan_s", "decoded", "decoded_once", "accuracy")  # a run's medians


def rotated(entries: Sequence[str], index: int) -> list[str]:
    """`entries` in round `index`'s order: shifted by one place per round."""
    shift = index % len(entries)
    return list(entries[shift:]) + list(entries[:shift])


def children_cpu_s() -> float:
    """User + system seconds of this process's children (and theirs) that ended so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def best_by_group(best: Mapping[str, float], groups: Mapping[str, str]) -> dict[str, float]:
    """Per group, the best of `best` (model id -> its best validation accuracy) among its
    models (`groups`: model id -> group)."""
    per_group: dict[str, float] = {}
    for model, accuracy in best.items():
        per_group[groups[model]] = max(per_group.get(groups[model], 0.0), accuracy)
    return per_group


def best_per_group(best: Mapping[str, float], groups: Mapping[str, str]) -> float:
    """The mean over groups of each group's best (`best_by_group`)."""
    return statistics.mean(best_by_group(best, groups).values())


def paired_difference(runs: Sequence[Measured], peers: Sequence[Measured]) -> tuple[float, float, int] | None:
    """The mean over (round, group) pairs of `runs`' best accuracy of a group minus `peers'` in
    the same round, its standard error and the pairs' count; None with fewer than 2 pairs."""
    diffs = [run.per_group[g] - peer.per_group[g] for run, peer in zip(runs, peers)
             for g in sorted(run.per_group) if g in peer.per_group]
    if len(diffs) < 2:
        return None
    return statistics.mean(diffs), statistics.stdev(diffs) / len(diffs) ** 0.5, len(diffs)


def decoded_by_group(events: Sequence[dict], groups: Mapping[str, str]) -> Counter:
    """Training samples each group's streams decoded: each `stream_end`'s count, to the group
    of the stream's members (a stream holds one group's models)."""
    group_of_stream = {e["stream"]: groups[e["model"]] for e in events if e["event"] == "member_start"}
    decoded: Counter = Counter()
    for event in events:
        if event["event"] == "stream_end" and event["stream"] in group_of_stream:
            decoded[group_of_stream[event["stream"]]] += event["decoded"]
    return decoded


def decoded_once(decoded: Mapping[str, int], samples: Mapping[str, int], epochs: Mapping[str, int]) -> int:
    """How many groups had their training samples decoded once per epoch pass: no more than
    their models' most `epochs` times their `samples`, within half a pass (a stream decodes
    whole chunks); a group nothing decoded for does not count."""
    return sum(1 for g in samples if 0 < decoded.get(g, 0) <= (epochs[g] + 0.5) * samples[g])


def group_facts(results: dict) -> tuple[dict[str, int], dict[str, int]]:
    """Each group's training samples (an epoch of its models) and its models' most epochs, from
    a grouped run's results.json."""
    samples: dict[str, int] = {}
    epochs: dict[str, int] = {}
    for model in results["models"]:
        group = results["groups"][model["id"]]
        if model["history"]:
            samples[group] = model["history"][0]["samples"]
        epochs[group] = max(epochs.get(group, 0), model["epochs"])
    return samples, epochs


def policy_run(work: Path, data: Path, policy: str) -> Measured:
    """One fresh `fleet run` of `policy` in `work/policy`."""
    shutil.rmtree(work / policy, ignore_errors=True)  # a fresh run, not a resumed one
    cpu = children_cpu_s()
    run = fleet_run(runtime_spec(work, data, policy), work / policy, FLEET_TIMEOUT_S)
    cpu = children_cpu_s() - cpu
    res, events = run.results, read_events(work / policy / "events.jsonl")
    samples, epochs = group_facts(res)
    best = best_by_group({m["id"]: m.get("best_val_accuracy") or 0.0 for m in res["models"]}, res["groups"])
    return Measured(run.wall_s, cpu, res["makespan_s"], res["samples_decoded"],
                    decoded_once(decoded_by_group(events, res["groups"]), samples, epochs),
                    statistics.mean(best.values()), best)


def job_array(resolved_spec: Path, facts: tuple[dict, dict], work: Path) -> Measured:
    """The outside peer: each (group, configuration) of a grouped run's resolved spec trained
    by `plain_loop.py` in a process of its own (its own DataLoader decoding its group's
    samples), ARRAY_SLOTS at a time; `facts`: each group's samples and epochs (`group_facts`)."""
    models = load_spec(str(resolved_spec)).models
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)

    def one(index: int) -> None:
        out = work / f"{index}.json"
        run_to_end([sys.executable, str(PLAIN_LOOP), str(resolved_spec), "--model", str(index), "--seed",
                    str(models[index].seed), "--threads", "1", "--json", str(out)], f"job array task {index}",
                   FLEET_TIMEOUT_S)

    started, cpu = time.perf_counter(), children_cpu_s()
    with ThreadPoolExecutor(ARRAY_SLOTS) as pool:
        list(pool.map(one, range(len(models))))
    wall, cpu = time.perf_counter() - started, children_cpu_s() - cpu
    trained = [json.loads((work / f"{i}.json").read_text()) for i in range(len(models))]
    groups = {m.id: m.group for m in models}
    decoded = tasks_decoded(trained, groups, facts[0])
    best = best_by_group({t["id"]: t["best_val_accuracy"] for t in trained}, groups)
    return Measured(wall, cpu, None, sum(decoded.values()), decoded_once(decoded, *facts),
                    statistics.mean(best.values()), best)


def tasks_decoded(trained: Sequence[dict], groups: Mapping[str, str], samples: Mapping[str, int]) -> Counter:
    """Training samples the job array's tasks decoded, by group: each task its group's
    `samples` every epoch it trained (its `samples_decoded` also counts the validation set it
    decoded once; fleet's runs count training samples only, and so does the table)."""
    decoded: Counter = Counter()
    for task in trained:
        decoded[groups[task["id"]]] += task["epochs"] * samples[groups[task["id"]]]
    return decoded


def runtime_rounds(work: Path, data: Path, runs: int) -> dict[str, list[Measured]]:
    """Every policy and the job array in each of `runs` rounds (`rotated`), each round's run
    directories under `work/round-K`; the job array trains round 0's grouped resolved spec."""
    measured: dict[str, list[Measured]] = {name: [] for name in RUN_ORDER}
    first = work / "round-0" / "grouped"
    for index in range(runs):
        folder = work / f"round-{index}"
        folder.mkdir(parents=True, exist_ok=True)
        for name in rotated(RUN_ORDER, index):
            if name == JOB_ARRAY:  # round 0 is in RUN_ORDER: grouped ran before it
                done = job_array(first / "spec.yaml", group_facts(read_results(first)), folder / "job-array")
            else:
                done = policy_run(folder, data, name)
            measured[name].append(done)
            print(f"  round {index + 1}, {name}: wall {done.wall_s:.1f} s, CPU {done.cpu_s:.1f} s", flush=True)
    return measured


def medians(runs: Sequence[Measured]) -> dict[str, float | None]:
    """Each field's median over `runs` (None where it has none: the job array's makespan)."""
    return {name: None if getattr(runs[0], name) is None else statistics.median(getattr(r, name) for r in runs)
            for name in FIGURES}


def runtime_table(measured: dict[str, list[Measured]], groups: int) -> str:
    """The medians over rounds of each policy's runs (of `groups` groups), and grouped's wall
    and CPU over its peers'."""
    lines = ["| policy | wall | makespan | CPU | samples decoded | groups decoded once per epoch pass "
             "| mean best val accuracy per group |", "|---|---:|---:|---:|---:|---:|---:|"]
    median = {name: medians(runs) for name, runs in measured.items()}
    for name, m in median.items():
        makespan = "-" if m["makespan_s"] is None else f"{m['makespan_s']:.1f} s"
        label = f"job array, plain PyTorch, {ARRAY_SLOTS} at a time" if name == JOB_ARRAY else name
        lines.append(f"| {label} | {m['wall_s']:.1f} s | {makespan} | {m['cpu_s']:.1f} s | {m['decoded']:,.0f} "
                     f"| {m['decoded_once']:.0f} of {groups} | {m['accuracy']:.3f} |")
    lines.append("")
    for peer in ("model-task", JOB_ARRAY):
        lines.append(f"grouped / {peer}: wall {median['grouped']['wall_s'] / median[peer]['wall_s']:.2f}x, "
                     f"CPU {median['grouped']['cpu_s'] / median[peer]['cpu_s']:.2f}x")
    for peer in ("model-task", JOB_ARRAY):
        paired = paired_difference(measured["grouped"], measured[peer])
        if paired is not None:
            lines.append(f"grouped - {peer}: best val accuracy per group {paired[0]:+.3f} (standard error "
                         f"{paired[1]:.3f} over {paired[2]} (round, group) pairs)")
    return "\n".join(lines)


def synthetic_groups(work: Path, samples: int) -> Path:
    """The synthetic grouped data set (made once per work directory)."""
    work.mkdir(parents=True, exist_ok=True)
    data = work / "groups.h5"
    if not data.exists():
        fleet("data", "make", "synthetic", "--format", "hdf5", "--out", str(data), "--samples", str(samples),
              "--image-size", "16", "--classes", "4", "--groups", "24", "--group-skew", "1.0", "--quiet",
              timeout=FLEET_TIMEOUT_S)
    return data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", default="100,1000")
    parser.add_argument("--skews", default="0.5,1,1.5")
    parser.add_argument("--nodes", default="4,8,16,32,64")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--runtime", action="store_true", help="real runs on virtual nodes instead")
    parser.add_argument("--samples", type=int, default=4800, help="--runtime: samples of the synthetic data set")
    parser.add_argument("--runs", type=at_least(1), default=1, help="--runtime: rounds, the order rotated each round")
    parser.add_argument("--work", default="/tmp/groups-runtime")
    args = parser.parse_args()
    if args.runtime:
        print(f"2 MLP configurations x 24 Zipf(1.0) groups of {args.samples} 16x16 samples, 3 epochs; 2 virtual "
              f"nodes x 2 CPU trainer slots + 1 preprocessor each; medians of {args.runs} round(s)")
        work = Path(args.work).resolve()
        measured = runtime_rounds(work, synthetic_groups(work, args.samples), args.runs)
        groups = len(group_facts(read_results(work / "round-0" / "grouped"))[0])
        print(runtime_table(measured, groups))
        return
    print(table([int(g) for g in args.groups.split(",")], [float(s) for s in args.skews.split(",")],
                [int(k) for k in args.nodes.split(",")], args.jobs))


if __name__ == "__main__":
    main()
