"""Training parity: fleet against a plain PyTorch loop on the same models, side by side.

Each model of a spec is trained twice over: by `fleet run` (the spec's policy,
`scheduler.profile: false` unless the spec says otherwise) and by a plain PyTorch loop of its
own (`bench/plain_loop.py`: a Dataset that decodes and transforms one sample at a time, a
shuffling DataLoader, `torch.optim` and its LR schedulers stepped once per epoch, evaluation
in `model.eval()` under `torch.no_grad()`), with the same network and initial weights, data,
split, transforms, optimizer, schedule, batch size and epochs. The plain models run in
`--workers` processes at a time (default: the spec's trainer slots), each with the spec's
torch threads per trainer, so both sides use the same cores.

The bench's own specs, whose JPEGs it makes: `bench/parity.yaml` (the default: ten small nets
of five families that cover every optimizer and LR schedule, 5 epochs) and
`bench/parity-sweep.yaml` (the 32-model sweep of `bench/e2e_cpu.py --sweep 4`, 2 epochs).

The plain loop runs twice, with two seeds for its data order, augmentation and dropout (the
weights stay the model's): the spread between those two runs is the noise against which
fleet's difference from the first is judged (`--no-noise`: one plain run, and the noise is
estimated from fleet's differences themselves). Fleet runs between the two plain runs, so
drift in the machine's load shows in the two plain wall times.

Checks printed before the table: that fleet's validation inputs equal the plain loop's
(mean and largest absolute difference after normalisation), and that each model's learning
rate per epoch is the same on both sides.

Usage: .venv/bin/python bench/parity.py [--spec SPEC] [--models N] [--epochs E] [--seed S]
       [--policy fleet-g] [--workers W] [--no-noise] [--keep DIR] [--timeout 1800]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import subprocess
import time
import zlib
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from multiprocessing import get_context
from pathlib import Path

import numpy as np
import yaml

from _harness import fleet_run, jpeg_folder, work_dir
from fleet.spec import load_spec, parse_spec, read_yaml
from plain_loop import PlainData, worker_init, worker_train
from preprocess.readers import open_reader
from preprocess.split import split_indices
from preprocess.transforms import Decode, Pipeline

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
DEFAULT_SPEC = BENCH / "parity.yaml"
BENCH_DATA = {  # the bench's own specs: the synthetic JPEG folder each is made for
    "parity.yaml": {"samples": 2400, "image_size": 48},
    "parity-sweep.yaml": {"samples": 3000, "image_size": 96},
}


# ----------------------------------------------------------------------------- the spec


def make_bench_data(root: Path, name: str) -> Path:
    """The JPEG folder of one of the bench's own specs (kept in `root` across invocations)."""
    return jpeg_folder(root / f"images-{Path(name).stem}", **BENCH_DATA[name])


def explicit_models(doc: dict, limit: int | None) -> list[dict]:
    """The spec's first `limit` models as single entries (id as name, every training field
    written out), so that a subset of a search trains the same models with the same seeds."""
    spec = parse_spec(doc)
    return [{"family": m.family, "name": m.id, "params": m.params, "train": m.train.model_dump(mode="json")}
            for m in spec.models[:limit]]


def bench_doc(args, root: Path) -> dict:
    """The spec this bench trains: the chosen one, with its data, models, epochs, seed and
    policy set as the options say."""
    doc = read_yaml(args.spec)
    spec_file = Path(args.spec).resolve()
    if spec_file.parent == BENCH and spec_file.name in BENCH_DATA:
        doc["data"]["path"] = str(make_bench_data(root, spec_file.name))
    if args.seed is not None:
        doc["seed"] = args.seed
    doc["models"] = explicit_models(doc, args.models)
    for model in doc["models"] if args.epochs is not None else ():
        model["train"]["max_epochs"] = args.epochs
    doc.pop("run_dir", None)
    scheduler = doc.setdefault("scheduler", {})
    scheduler.setdefault("profile", False)
    if args.policy:
        scheduler["policy"] = args.policy
    return doc


# ----------------------------------------------------------------------------- the two sides


def run_fleet(spec_path: Path, run_dir: Path, timeout: float) -> tuple[dict, dict, float]:
    """`fleet run`: its results.json, its plan.json and the command's wall seconds."""
    shutil.rmtree(run_dir, ignore_errors=True)
    run = fleet_run(spec_path, run_dir, timeout)
    return run.results, json.loads((run_dir / "plan.json").read_text()), run.wall_s


def plain_seed(model_seed: int, run: int) -> int:
    return zlib.crc32(f"{model_seed}:plain:{run}".encode()) & 0x7FFFFFFF


def run_plain(spec_path: Path, spec, run: int, workers: int) -> tuple[list[dict], float]:
    """Every model by the plain loop, `workers` processes at a time; results in spec order and
    the wall seconds (process start-up and data loading included)."""
    threads = spec.cluster.threads_per_trainer
    started = time.perf_counter()
    with ProcessPoolExecutor(workers, mp_context=get_context("spawn"), initializer=worker_init,
                             initargs=(str(spec_path), threads)) as pool:
        futures = [pool.submit(worker_train, i, plain_seed(m.seed, run)) for i, m in enumerate(spec.models)]
        results = [f.result() for f in futures]
    return results, time.perf_counter() - started


# ----------------------------------------------------------------------------- checks


def input_check(spec) -> dict[str, float]:
    """Mean and largest |fleet's validation input - the plain loop's| (model space), with
    fleet's pipeline as it runs and with its JPEG decoding at full size (no draft mode)."""

    reader = open_reader(spec.data, seed=spec.seed)
    _, val_idx = split_indices(reader.labels, spec.data.val_fraction, spec.seed)
    raw, plain_x = reader.read(np.sort(val_idx)), PlainData.open(spec).val_x.numpy()
    pipeline = Pipeline(spec.preprocess, spec.data)
    fleet_x = pipeline(raw, np.random.default_rng(0), train=False)
    pipeline.steps = [replace(s, draft=None) if isinstance(s, Decode) else s for s in pipeline.steps]
    full_x = pipeline(raw, np.random.default_rng(0), train=False)
    diff, full = np.abs(fleet_x - plain_x), np.abs(full_x - plain_x)
    return {"mean": float(diff.mean()), "max": float(diff.max()), "full_mean": float(full.mean()),
            "full_max": float(full.max())}


def lr_mismatches(fleet_models: dict, plain: list[dict]) -> list[str]:
    """Models whose learning rate differs in some epoch (relative 1e-6), with the first such epoch."""
    out = []
    for result in plain:
        ours = [h["lr"] for h in fleet_models[result["id"]]["history"]]
        theirs = [h["lr"] for h in result["history"]]
        for epoch, (a, b) in enumerate(zip(ours, theirs), start=1):
            if not math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-12):
                out.append(f"{result['id']} epoch {epoch}: fleet {a:.6g}, plain {b:.6g}")
                break
    return out


def gpu_counts(plan: dict) -> dict[str, str]:
    """Each model's trainers per group over the rounds, e.g. ``1`` or ``1,2``."""
    counts: dict[str, list[int]] = {}
    for round_ in plan["rounds"]:
        for member in round_["members"]:
            seen = counts.setdefault(member["model"], [])
            if len(member["gpus"]) not in seen:
                seen.append(len(member["gpus"]))
    return {model: ",".join(map(str, sorted(m))) for model, m in counts.items()}


# ----------------------------------------------------------------------------- the report


def mean_sd(values: list[float]) -> tuple[float, float]:
    array = np.asarray(values, dtype=float)
    return float(array.mean()), float(array.std(ddof=1)) if len(array) > 1 else 0.0


def table(spec, fleet: dict, plan: dict, plain: list[dict], second: list[dict] | None) -> list[str]:
    models = {m["id"]: m for m in fleet["models"]}
    gpus = gpu_counts(plan)
    lines = [f"{'model':<16}{'gpus':>5}{'epochs f/p':>11}{'best acc plain':>15}{'plain s2':>9}{'fleet':>7}"
             f"{'fleet-plain':>12}{'loss plain':>11}{'fleet':>7}{'plain s':>9}{'fleet GPU-s':>12}"]
    for i, p in enumerate(plain):
        f = models[p["id"]]
        s2 = f"{second[i]['best_val_accuracy']:.3f}" if second else "-"
        lines.append(
            f"{p['id']:<16}{gpus.get(p['id'], '-'):>5}{f['epochs']:>6}/{p['epochs']:<4}{p['best_val_accuracy']:>15.3f}"
            f"{s2:>9}{f['best_val_accuracy']:>7.3f}{f['best_val_accuracy'] - p['best_val_accuracy']:>+12.3f}"
            f"{p['final_train_loss']:>11.3f}{f['final_train_loss']:>7.3f}{p['seconds']:>9.1f}{f['gpu_seconds']:>12.1f}"
        )
    return lines


def verdict(fleet: dict, plain: list[dict], second: list[dict] | None) -> tuple[list[str], dict]:
    """The mean difference in best accuracy and the noise it is judged against."""
    models = {m["id"]: m for m in fleet["models"]}
    diffs = [models[p["id"]]["best_val_accuracy"] - p["best_val_accuracy"] for p in plain]
    mean_d, sd_d = mean_sd(diffs)
    n = len(diffs)
    if second:
        seed_diffs = [b["best_val_accuracy"] - a["best_val_accuracy"] for a, b in zip(plain, second)]
        mean_s, sd_noise = mean_sd(seed_diffs)
        source = f"plain seed 2 - seed 1: mean {mean_s:+.4f}, sd {sd_noise:.4f} per model"
    else:
        mean_s, sd_noise, source = None, sd_d, "sd of fleet - plain per model"
    se = sd_noise / math.sqrt(n)
    inside = abs(mean_d) <= 2 * se
    lines = [
        f"best validation accuracy, mean over {n} models: plain {np.mean([p['best_val_accuracy'] for p in plain]):.4f}, "
        f"fleet {np.mean([models[p['id']]['best_val_accuracy'] for p in plain]):.4f}; fleet - plain {mean_d:+.4f} "
        f"(sd {sd_d:.4f} per model)",
        f"noise: {source}; standard error of a mean over {n} models {se:.4f}; "
        f"|fleet - plain| {'<=' if inside else '>'} 2 SE: {'within noise' if inside else 'NOT within noise'}",
    ]
    summary = {"mean_diff": mean_d, "sd_diff": sd_d, "seed_mean_diff": mean_s, "noise_sd": sd_noise, "se": se,
               "within_noise": inside}
    return lines, summary


def by_group_size(fleet: dict, plan: dict, plain: list[dict]) -> list[str]:
    """The mean differences of the models that trained on one trainer throughout, and of those
    that trained data-parallel (a group of m trainers takes m x batch_size samples a step)."""
    models, gpus = {m["id"]: m for m in fleet["models"]}, gpu_counts(plan)
    parts: dict[str, list[tuple[float, float]]] = {"one trainer": [], "groups of 2+": []}
    for p in plain:
        f = models[p["id"]]
        parts["one trainer" if gpus.get(p["id"]) == "1" else "groups of 2+"].append(
            (f["best_val_accuracy"] - p["best_val_accuracy"], f["final_train_loss"] - p["final_train_loss"]))
    shown = [f"{name} ({len(d)} models): best accuracy {np.mean([a for a, _ in d]):+.4f}, final train loss "
             f"{np.mean([l for _, l in d]):+.4f}" for name, d in parts.items() if d]
    return ["fleet - plain by group size: " + "; ".join(shown)]


def machine_line() -> str:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO)
    return (f"commit {commit.stdout.strip() or '?'}; {platform.machine()} {os.cpu_count()} cores, "
            f"load average {os.getloadavg()[0]:.1f}; Python {platform.python_version()}")


def timing_lines(fleet: dict, fleet_wall: float, walls: list[float], workers: int, spec) -> list[str]:
    slots = spec.cluster.nodes * spec.cluster.gpus_per_node
    plain = ", ".join(f"{w:.1f}" for w in walls)
    mean_plain = sum(walls) / len(walls)
    return [
        f"wall time: plain loop {plain} s ({workers} processes at a time); fleet run {fleet_wall:.1f} s "
        f"(makespan {fleet['makespan_s']:.1f} s, start-up {fleet['overhead_s'].get('startup', 0.0):.1f} s, "
        f"{slots} trainer slots + {spec.cluster.preprocessors_per_node} preprocessor(s), policy {fleet['policy']})",
        f"plain / fleet wall: {mean_plain / fleet_wall:.2f}x (fleet makespan: {mean_plain / fleet['makespan_s']:.2f}x)",
    ]


# ----------------------------------------------------------------------------- main


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", default=str(DEFAULT_SPEC), help="ensemble spec (default: bench/parity.yaml)")
    parser.add_argument("--models", type=int, help="train only the spec's first N models")
    parser.add_argument("--epochs", type=int, help="max_epochs of every model")
    parser.add_argument("--seed", type=int, help="the spec's seed")
    parser.add_argument("--policy", help="fleet's policy (default: the spec's)")
    parser.add_argument("--workers", type=int, help="plain-loop processes at a time (default: the trainer slots)")
    parser.add_argument("--no-noise", action="store_true", help="one plain run (no second seed)")
    parser.add_argument("--keep", metavar="DIR", help="keep the data, the spec, fleet's run directory and parity.json")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds fleet's run may take")
    return parser.parse_args()


def run_all(args, root: Path) -> dict:
    doc = bench_doc(args, root)
    spec_path = root / "parity-spec.yaml"
    spec_path.write_text(yaml.safe_dump(doc, sort_keys=False))
    spec = load_spec(spec_path)
    workers = args.workers or spec.cluster.nodes * spec.cluster.gpus_per_node
    print(machine_line(), flush=True)
    epochs = ",".join(str(e) for e in sorted({m.train.max_epochs for m in spec.models}))
    print(f"{len(spec.models)} models, max_epochs {epochs}, policy "
          f"{spec.scheduler.policy}; plain loop in {workers} processes", flush=True)
    plain, wall_a = run_plain(spec_path, spec, 1, workers)
    print(f"plain loop (seed 1): {wall_a:.1f} s", flush=True)
    fleet, plan, fleet_wall = run_fleet(spec_path, root / "fleet-run", args.timeout)
    print(f"fleet run: {fleet_wall:.1f} s", flush=True)
    second, walls = None, [wall_a]
    if not args.no_noise:
        second, wall_b = run_plain(spec_path, spec, 2, workers)
        walls.append(wall_b)
        print(f"plain loop (seed 2): {wall_b:.1f} s", flush=True)
    return {"spec": spec, "workers": workers, "plain": plain, "second": second, "fleet": fleet, "plan": plan,
            "fleet_wall": fleet_wall, "plain_walls": walls}


def report(run: dict) -> dict:
    spec, fleet, plain, second = run["spec"], run["fleet"], run["plain"], run["second"]
    inputs = input_check(spec)
    print(f"validation inputs, fleet's pipeline vs the plain transforms: mean |diff| {inputs['mean']:.2e}, "
          f"max {inputs['max']:.2e}; with fleet's JPEGs decoded at full size (no draft mode): mean "
          f"{inputs['full_mean']:.2e}, max {inputs['full_max']:.2e}")
    lrs = lr_mismatches({m["id"]: m for m in fleet["models"]}, plain)
    print("learning rate per epoch: " + ("the same for every model" if not lrs else "DIFFERS: " + "; ".join(lrs)))
    print("\n".join(table(spec, fleet, run["plan"], plain, second)))
    lines, summary = verdict(fleet, plain, second)
    lines += by_group_size(fleet, run["plan"], plain)
    print("\n".join(lines + timing_lines(fleet, run["fleet_wall"], run["plain_walls"], run["workers"], spec)))
    return {**summary, "inputs": inputs, "lr_mismatches": lrs}


def main() -> None:
    args = parse_args()
    with work_dir(args.keep) as root:
        run = run_all(args, root)
        summary = report(run)
        record = {k: v for k, v in run.items() if k not in ("spec", "plan")} | {"summary": summary}
        (root / "parity.json").write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
