"""Adaptive search against random search (issue 48), and the run's greedy ensemble against its
best single model.

One CNN family with 4 searched parameters (learning rate, weight decay, width, depth) on the
synthetic JPEG set (with a held-out test split), a budget of `--budget` models (48), for each
of `--seeds` seeds (3), with and without ASHA early stopping: ``sampler: random`` (the budget
drawn when the spec is read) against ``sampler: tpe`` (asked while the run trains). Width and
depth are one categorical dimension (`ARCHITECTURES`, the CNN's `channels`), which random
search crosses as a grid, so random's ``samples: budget / 6`` and tpe's ``budget`` make the
same number of models over the same space. Per (sampler, early stopping): the best validation
accuracy of the run and the test accuracy of that model (means over the seeds), and the greedy
ensemble (`fleet ensemble --size K`) against the best single model on test: accuracy, NLL, ECE.

Targets (issue 48): tpe's best validation accuracy within 0.5 points of random's or better
(mean over the seeds); the ensemble's test NLL below the best single model's.

Usage:
    python bench/search.py [--budget 48] [--seeds 3] [--samples 3000] [--epochs 6] [--slots 4]
    python bench/search.py --budget 6 --seeds 1 --samples 300 --epochs 2 --slots 2   # a tiny check
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import yaml

from _harness import at_least, fleet, fleet_run, jpeg_folder, work_dir

SAMPLERS = ("random", "tpe")
EARLY_STOPS = ("none", "asha")
ARCHITECTURES = [[w * 2 ** k for k in range(depth)] for depth in (1, 2, 3) for w in (8, 16)]
"""Width x depth as the CNN's `channels` (a width doubling at each of `depth` layers): one
categorical dimension, which random search crosses as a grid (`samples` = budget / 6 each)."""
SPACE = {"train.lr": {"loguniform": [0.003, 0.3]}, "train.weight_decay": {"loguniform": [1e-6, 1e-2]},
         "channels": {"choice": ARCHITECTURES}}
FLEET_TIMEOUT_S = 7200


def spec_doc(args: argparse.Namespace, data: Path, sampler: str, early: str, seed: int) -> dict:
    """One run's spec: the searched CNN, `budget` models either way."""
    entry = {"family": "cnn", "name": "cnn", "sampler": sampler, "search": SPACE,
             **({"samples": args.budget // len(ARCHITECTURES)} if sampler == "random" else {"budget": args.budget})}
    return {
        "name": f"search-{sampler}-{early}-{seed}", "seed": seed,
        "data": {"source": "imagefolder", "path": str(data), "image_size": args.image_size, "val_fraction": 0.15,
                 "test_fraction": 0.15, "channels": 3},
        "preprocess": ["decode", {"flip": {"p": 0.5}},
                       {"normalize": {"mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25]}}],
        "models": [entry],
        "train": {"batch_size": 32, "max_epochs": args.epochs, "stop": {"metric": "val_accuracy", "patience": 99}},
        "scheduler": {"policy": "auto", **({"early_stop": {"method": "asha", "min_epochs": 1, "reduction": 3}}
                                           if early == "asha" else {})},
        "cluster": {"nodes": 1, "gpus_per_node": args.slots, "preprocessors_per_node": 1, "device": "cpu",
                    "threads_per_trainer": 1},
    }


def one_run(args: argparse.Namespace, work: Path, data: Path, sampler: str, early: str, seed: int) -> dict:
    """Train one search, select its ensemble; the figures of the row."""
    folder = work / f"{sampler}-{early}-{seed}"
    spec = folder / "spec.yaml"
    folder.mkdir(parents=True, exist_ok=True)
    spec.write_text(yaml.safe_dump(spec_doc(args, data, sampler, early, seed), sort_keys=False))
    run = fleet_run(spec, folder / "run", FLEET_TIMEOUT_S, what=f"{sampler} {early} seed {seed}")
    models = run.results["models"]
    best = max(models, key=lambda m: m.get("best_val_accuracy") or 0.0)
    fleet("ensemble", str(folder / "run"), "--size", str(args.ensemble), timeout=600)
    chosen = json.loads((folder / "run" / "ensemble.json").read_text())
    return {"val": best["best_val_accuracy"], "test_of_best": chosen["best_single"]["accuracy"],
            "models": len(models), "wall_s": run.wall_s, "ensemble": chosen["ensemble"],
            "single": chosen["best_single"], "evaluated_on": chosen["evaluated_on"]}


def table(rows: dict[tuple[str, str], list[dict]]) -> str:
    lines = ["| sampler | early stop | models | best val acc | its test acc | ensemble test acc / NLL / ECE "
             "| best single test acc / NLL / ECE | wall s |", "|---|---|---:|---:|---:|---|---|---:|"]
    for (sampler, early), runs in rows.items():
        def mean(get) -> float:
            return statistics.mean(get(r) for r in runs)
        ens = "/".join(f"{mean(lambda r, k=k: r['ensemble'][k]):.3f}" for k in ("accuracy", "nll", "ece"))
        one = "/".join(f"{mean(lambda r, k=k: r['single'][k]):.3f}" for k in ("accuracy", "nll", "ece"))
        lines.append(f"| {sampler} | {early} | {mean(lambda r: r['models']):.0f} | {100 * mean(lambda r: r['val']):.2f} "
                     f"| {100 * mean(lambda r: r['test_of_best']):.2f} | {ens} | {one} | {mean(lambda r: r['wall_s']):.0f} |")
    return "\n".join(lines)


def verdict(rows: dict[tuple[str, str], list[dict]]) -> list[str]:
    out = []
    for early in EARLY_STOPS:
        random_best = statistics.mean(r["val"] for r in rows[("random", early)])
        tpe_best = statistics.mean(r["val"] for r in rows[("tpe", early)])
        out.append(f"early stop {early}: tpe - random best val accuracy = {100 * (tpe_best - random_best):+.2f} points "
                   f"(target >= -0.5): {'met' if tpe_best - random_best >= -0.005 else 'NOT met'}")
    gains = [r["single"]["nll"] - r["ensemble"]["nll"] for runs in rows.values() for r in runs]
    out.append(f"ensemble NLL below the best single model's by {statistics.mean(gains):.4f} nats on average "
               f"({sum(g > 0 for g in gains)} of {len(gains)} runs): {'met' if min(gains) > 0 else 'NOT met'}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget", type=at_least(len(ARCHITECTURES)), default=48, help="a multiple of 6")
    parser.add_argument("--seeds", type=at_least(1), default=3)
    parser.add_argument("--samples", type=at_least(100), default=3000, help="synthetic JPEGs (10 classes)")
    parser.add_argument("--image-size", type=at_least(8), default=32)
    parser.add_argument("--epochs", type=at_least(1), default=6)
    parser.add_argument("--slots", type=at_least(1), default=4, help="CPU trainer slots")
    parser.add_argument("--ensemble", type=at_least(1), default=10, help="fleet ensemble --size")
    parser.add_argument("--work", help="working directory (kept; default: a temporary one)")
    args = parser.parse_args()
    if args.budget % len(ARCHITECTURES):
        parser.error(f"--budget: a multiple of {len(ARCHITECTURES)} (random search crosses the architectures)")
    with work_dir(args.work) as work:
        data = jpeg_folder(work / "jpeg", args.samples, args.image_size)
        rows: dict[tuple[str, str], list[dict]] = {(s, e): [] for e in EARLY_STOPS for s in SAMPLERS}
        for seed in range(11, 11 + args.seeds):
            for early in EARLY_STOPS:
                for sampler in SAMPLERS:  # alternating within a seed: drift in the load falls on both
                    rows[(sampler, early)].append(one_run(args, work, data, sampler, early, seed))
        evaluated = {r["evaluated_on"] for runs in rows.values() for r in runs}
        print(f"budget {args.budget}, {args.seeds} seed(s), {args.samples} JPEGs of {args.image_size} px, "
              f"{args.epochs} epochs at most, {args.slots} CPU slots; scored on {', '.join(sorted(evaluated))}")
        print(table(rows))
        print("\n".join(verdict(rows)))


if __name__ == "__main__":
    main()
