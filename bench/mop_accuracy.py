"""Model hopping's accuracy: the same models trained by `mop` over 4 partitions against the
plain sequential loop over the unpartitioned data (Cerebro's sequential-equivalence claim).

A learnable synthetic data set (HDF5) is split with `fleet data partition --parts 4`. Both runs
use the same training and validation samples (each partition split as its node splits it), the
same seeds, the same epochs (no early stop) and the same models:

* hopping: ``fleet run`` with ``scheduler.policy: mop`` on 4 virtual nodes x 1 trainer slot and
  1 preprocessor (8 MPI ranks); every epoch is 4 visits, one per partition, in a random order;
* unpartitioned: ``fleet run --local``, one model after another in one process, each epoch one
  pass over all training samples in one global shuffle.

Prints each model's best validation accuracy in both, and the mean difference (target: within
1 point, mean over >= 8 models).

Usage:
    python bench/mop_accuracy.py [--samples 6000] [--epochs 6] [--work /tmp/mop-accuracy]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
from pathlib import Path

import yaml

from _harness import fleet, fleet_run
from mop import FLEET_TIMEOUT_S

MODELS = [
    {"family": "cnn", "name": "cnn-a", "params": {"channels": [16, 32], "hidden": 64}},
    {"family": "cnn", "name": "cnn-b", "params": {"channels": [8, 16], "hidden": 32}},
    {"family": "cnn", "name": "cnn-c", "params": {"channels": [16], "hidden": 0}, "train": {"lr": 0.02}},
    {"family": "cnn", "name": "cnn-d", "params": {"channels": [8, 16, 32], "hidden": 64}},
    {"family": "mlp", "name": "mlp-a", "params": {"hidden": [128]}},
    {"family": "mlp", "name": "mlp-b", "params": {"hidden": [256, 128]}},
    {"family": "mlp", "name": "mlp-c", "params": {"hidden": [64]}, "train": {"lr": 0.02}},
    {"family": "mlp", "name": "mlp-d", "params": {"hidden": [512]}, "train": {"lr": 0.005}},
]


def write_spec(work: Path, epochs: int) -> Path:
    doc = {
        "name": "mop-accuracy", "seed": 3,
        "data": {"source": "hdf5", "path": str(work / "parts"), "partitioned": True, "image_size": 16},
        "models": MODELS,
        "train": {"batch_size": 32, "max_epochs": epochs, "optimizer": "sgd", "lr": 0.01, "momentum": 0.9,
                  "stop": {"patience": 100}},
        "scheduler": {"policy": "mop", "profile": False},
        "cluster": {"nodes": 4, "gpus_per_node": 1, "preprocessors_per_node": 1, "virtual_nodes": True,
                    "device": "cpu"},
        "runtime": {"timeout_s": 300},
    }
    path = work / "spec.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def best_accuracy(results: dict) -> dict[str, float]:
    return {m["id"]: m["best_val_accuracy"] for m in results["models"]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=6000)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--work", default="/tmp/mop-accuracy")
    args = parser.parse_args(argv)
    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    fleet("data", "make", "synthetic", "--format", "hdf5", "--out", str(work / "all.h5"), "--samples",
          str(args.samples), "--image-size", "16", "--classes", "10", "--quiet", timeout=FLEET_TIMEOUT_S)
    fleet("data", "partition", "--in", str(work / "all.h5"), "--parts", "4", "--out", str(work / "parts"), "--quiet",
          timeout=FLEET_TIMEOUT_S)
    spec = write_spec(work, args.epochs)
    runs = {name: fleet_run(spec, work / name, FLEET_TIMEOUT_S, *extra)
            for name, extra in (("hopping", ()), ("unpartitioned", ("--local",)))}
    times = {name: run.wall_s for name, run in runs.items()}
    hop, whole = best_accuracy(runs["hopping"].results), best_accuracy(runs["unpartitioned"].results)
    visits = [json.loads(line) for line in (work / "hopping" / "visits.jsonl").read_text().splitlines()]
    print(f"{len(MODELS)} models, {args.epochs} epochs, {args.samples} synthetic 16x16 images, 10 classes; "
          f"mop over 4 partitions ({len(visits)} visits) vs the sequential loop over all of them")
    print("| model | best val accuracy, mop over 4 partitions | unpartitioned | difference (points) |")
    print("|---|---:|---:|---:|")
    for model in hop:
        print(f"| {model} | {hop[model]:.4f} | {whole[model]:.4f} | {100 * (hop[model] - whole[model]):+.2f} |")
    mean = statistics.mean(100 * (hop[m] - whole[m]) for m in hop)
    print(f"| mean | {statistics.mean(hop.values()):.4f} | {statistics.mean(whole.values()):.4f} | {mean:+.2f} |")
    print(f"wall time: hopping {times['hopping']:.0f} s (8 ranks), unpartitioned {times['unpartitioned']:.0f} s "
          "(one process)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
