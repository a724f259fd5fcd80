"""Model hopping over partitioned data: `fleet-hop` against `mop` (Cerebro) in the simulator.

The paper-like workload (``paper100``: 100 ResNet/DenseNet variants, 4 GPUs per node) on 8 to
64 nodes with one partition per node, as Cerebro runs, seeded; exact epoch estimates and
estimates off by U(0.7, 1.3); and exact estimates where decoding limits (each node's
preprocessors decode twice a mean model's single-GPU rate: four GPUs of a node training
alone would need about four times that, so a stream shared by a node's visits goes faster).
Each row: the mean makespan of both policies, their ratio, the
makespan over the lower bound LB2 (which ignores partitions and hops, so no hopping policy
reaches 1.0), the hops, and the bytes the hops move between nodes (a checkpoint of
``state_factor`` x the parameter bytes written by one node and read by the next), and the
samples decoded relative to one decode per model-epoch. Costs: the simulator's defaults
(``Overheads``: 5 s + 3 x parameter bytes at 1 GB/s per checkpoint and per restore).

``--runtime``: the MPI runtime instead, on the emulated device (a training step sleeps for the
time the profile's rates predict; the ranks, streams, checkpoints and hops are real): 8 CNNs
on 4 virtual nodes x 2 trainer slots + 1 preprocessor (12 ranks), a synthetic HDF5 data set in
4 partitions (one per node). For `mop` and `fleet-hop`, in one invocation: the measured
makespan against the simulator's prediction on the same rates and partitions, with the
checkpoint costs of these tiny emulated models (0.1 s a checkpoint or restore, as the FLEET-G
emulated check uses) and with the dry run's costs for real models (0.5 s + 3 x parameter bytes
at 1 GB/s); the bytes the hops moved between nodes (the emulated checkpoints, and what the
same CNNs' real parameters and SGD momentum would weigh) against the data a replicated-data
design (every model reading every sample of every epoch from shared storage) would move; and
the samples decoded.

Usage:
    python bench/mop.py [--seeds 3] [--jobs 2] [--nodes 8,16,32,64]
    python bench/mop.py --runtime [--work /tmp/mop-runtime]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
from dataclasses import replace
from multiprocessing import Pool
from pathlib import Path

import yaml

from _harness import fleet, fleet_run
from fleet.inspect import describe_ensemble
from fleet.prediction import predicted_makespans, with_partitions
from fleet.schedule import Overheads, create_policy, lower_bounds, noisy_estimates, paper100, simulate, whole_epochs
from fleet.schedule.simulator import Outcome
from fleet.schedule_io import load_profile, profile_scenario
from fleet.spec import load_spec
from preprocess.partition import job_partitions

NODES = (8, 16, 32, 64)
ESTIMATES = {"exact": 0.0, "x U(0.7, 1.3)": 0.3, "exact, decode-limited": 0.0}
DECODE_PER_NODE = 2.0  # decode-limited rows: a node's preprocessors decode 2 x a mean model's 1-GPU rate
COSTS = Overheads()
EMULATED_COSTS = Overheads(latency_s=0.1, bandwidth=float("inf"), planning_s=0.0)  # tiny emulated checkpoints
FLEET_TIMEOUT_S = 3600  # seconds one `fleet` command of --runtime may take


def _run(task):
    nodes, label, seed, policy = task
    workload = paper100(seed)
    scenario = workload.scenario(4 * nodes)
    spread = ESTIMATES[label]
    if spread:
        scenario = replace(scenario, epochs_estimate=noisy_estimates(workload.true_epochs, seed, spread))
    n = scenario.rates.samples_per_epoch
    scenario = replace(scenario, partition_sizes=(n / nodes,) * nodes)
    if label.endswith("decode-limited"):
        mean_rate = statistics.mean(scenario.rates.rate(m, 1) for m in scenario.rates.ids)
        scenario = replace(scenario, decode_rate=DECODE_PER_NODE * mean_rate * nodes)
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


RUNTIME_MODELS = {  # name: (channels, hidden, single-slot rate in samples/s, epochs)
    "c0": ([8], 0, 700.0, 3), "c1": ([8, 16], 32, 520.0, 2), "c2": ([16, 32], 64, 380.0, 3),
    "c3": ([16], 32, 640.0, 2), "c4": ([8, 16, 32], 64, 300.0, 3), "c5": ([32], 0, 450.0, 2),
    "c6": ([8, 8], 16, 820.0, 3), "c7": ([16, 16], 32, 560.0, 2),
}


def runtime_spec(work: Path, policy: str) -> Path:
    doc = {
        "name": "mop-runtime", "seed": 5,
        "data": {"source": "hdf5", "path": str(work / "parts"), "partitioned": True, "image_size": 16},
        "models": [{"family": "cnn", "name": n, "params": {"channels": c, "hidden": h}}
                   for n, (c, h, _, _) in RUNTIME_MODELS.items()],
        "train": {"batch_size": 32, "max_epochs": 10},
        "scheduler": {"policy": policy, "profile": False},
        "cluster": {"nodes": 4, "gpus_per_node": 2, "preprocessors_per_node": 1, "virtual_nodes": True,
                    "device": "emulated"},
        "runtime": {"timeout_s": 120},
    }
    path = work / f"{policy}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def runtime_profile(run_dir: Path, samples: int, params: dict[str, int]) -> None:
    """The emulated rates: r(2) = 1.8 r(1); epochs as listed (the emulated device converges there)."""
    run_dir.mkdir(parents=True)
    models = [{"id": n, "rates": {"1": r, "2": 1.8 * r}, "epochs": e, "param_bytes": 4 * params[n]}
              for n, (_, _, r, e) in RUNTIME_MODELS.items()]
    doc = {"schema": 1, "gpus_per_node": 2, "samples_per_epoch": samples, "models": models}
    (run_dir / "profile.json").write_text(json.dumps(doc))


def runtime_table(work: Path) -> str:
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    fleet("data", "make", "synthetic", "--format", "hdf5", "--out", str(work / "all.h5"), "--samples", "4000",
          "--image-size", "16", "--classes", "10", "--quiet", timeout=FLEET_TIMEOUT_S)
    fleet("data", "partition", "--in", str(work / "all.h5"), "--parts", "4", "--out", str(work / "parts"), "--quiet",
          timeout=FLEET_TIMEOUT_S)
    lines = ["| policy | measured makespan | predicted (emulated costs) | measured / predicted | predicted (dry run's "
             "costs) | visits | multi-slot visits | moved by hops: emulated / real CNN state | a replicated-data "
             "design would read | decoded samples |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for policy in ("mop", "fleet-hop"):
        spec_path = runtime_spec(work, policy)
        spec = load_spec(spec_path)
        params = {row.id: row.stats.parameters for row in describe_ensemble(spec).rows}
        samples = int(job_partitions(spec.data, 4, 2).samples)
        run_dir = work / policy
        runtime_profile(run_dir, samples, params)
        rates = load_profile(run_dir / "profile.json")
        dry_run = predicted_makespans(spec, rates, (policy,))[policy]
        epochs = [float(e) for (_, _, _, e) in RUNTIME_MODELS.values()]
        scenario = with_partitions(profile_scenario(rates, whole_epochs(epochs), tuple(epochs), 8), spec)
        predicted = simulate(create_policy(policy, seed=spec.seed), scenario, EMULATED_COSTS).makespan
        run = fleet_run(spec_path, run_dir, FLEET_TIMEOUT_S)
        res, wall = run.results, run.wall_s
        visits = [json.loads(line) for line in (run_dir / "visits.jsonl").read_text().splitlines()]
        sizes = {p.parent.name: json.loads(p.read_text())["bytes"] for p in (run_dir / "checkpoints").glob("*/latest.json")}
        epochs = {m["id"]: m["epochs"] for m in res["models"]}
        hops = {m: sum(1 for v in visits if v["model"] == m) - 1 for m in epochs}  # no hop after the last visit
        moved = sum(sizes[m] * hops[m] for m in hops)
        real = sum(2 * 4 * params[m] * hops[m] for m in hops)  # float32 parameters and their momentum
        replicated = sum(epochs.values()) * samples * 16 * 16 * 3  # uint8 images, every model-epoch
        wide = sum(1 for v in visits if len(v["gpus"]) > 1)
        makespan = res["makespan_s"]
        lines.append(f"| {policy} | {makespan:.1f} s (wall {wall:.0f} s) | {predicted:.1f} s | {makespan / predicted:.2f} "
                     f"| {dry_run:.1f} s | {len(visits)} | {wide} | {moved / 1e6:.2f} / {real / 1e6:.1f} MB "
                     f"| {replicated / 1e6:.1f} MB | {res['samples_decoded']:,} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--nodes", default=",".join(map(str, NODES)))
    parser.add_argument("--runtime", action="store_true", help="the MPI runtime on the emulated device instead")
    parser.add_argument("--work", default="/tmp/mop-runtime")
    args = parser.parse_args(argv)
    if args.runtime:
        print("8 CNNs (emulated), 4 virtual nodes x 2 trainer slots + 1 preprocessor, 4 partitions of 4,000 "
              "16x16 images")
        print(runtime_table(Path(args.work)))
        return 0
    nodes = [int(k) for k in args.nodes.split(",")]
    print(f"paper100, one partition per node, {args.seeds} seeds, costs {COSTS}")
    print(table(nodes, args.seeds, args.jobs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
