"""Training throughput of a fused bundle (issue 49) against its members trained one after another.

For each family (`--families`, default a small CNN and a small ResNet, `PARAMS`), `--members`
(8) variants of one architecture that differ in learning rate (`--lr` times 1, 1.35, 1.35^2, ...;
seeds differ too) train on the same random batches (`--batch` images of `--shape`, `--classes`
classes; `--batches` of them, cycled) with SGD (momentum 0.9, fleet's default weight decay), two
ways, in one process on the same threads (`--threads`, torch's; default 1, fleet's default
``threads_per_trainer``) and device (`--device`: ``cpu``, or ``cuda`` on a lent GPU):

- ``fused``: one `FusedTorchEngine` of all members; a step is one ``train_step`` (forward and
  backward of every member under ``torch.func.vmap``, one stacked optimizer step);
- ``one by one``: each member's own `TorchEngine`, the members trained after each other (one
  model at a time on the device: a block is each member's `--steps` steps in turn, so the time
  per member is what one trainer of one model takes on the same device).

Method. `--warmup` untimed steps of each, then `--repeats` blocks of `--steps` timed steps per
contender, interleaved (the order swapped each block, so drift hits both alike); on CUDA each
block is synchronised at both ends. A contender's figure is the median block, in member-samples
per second (members x batch x steps / seconds): ``fused / one by one`` above 1 means the bundle
trains the members faster. Peak memory is measured apart, in a child process per contender
(the bundle, or one member's engine: what one trainer holds), after the same warm-up and a
block of steps: on CUDA ``torch.cuda.max_memory_allocated``, on the CPU the child's peak
resident set (VmHWM, reset just before) less its resident set before the contender was
built (the CPU figure counts torch's allocator caches; compare it between contenders only).

`--runtime` measures the same sweep as a real run instead: `fleet run` of the `--members` CNN
variants (the bench's CNN, `PARAMS`, and learning rates as above; seeds from the spec's) on
synthetic images (`--samples` of `--shape`, 10 % held out for validation, `--batch` a batch,
SGD with momentum 0.9), `--epochs` epochs each (no early stop: patience 1000), on one CPU node
of `--slots` trainer slots (`--threads` each) and one preprocessor, with policy `--policy`,
`scheduler.profile: false`, once per `runtime.fuse` mode of `--modes` (``never``: each model on
its own, the policy's plan; ``always``: the bundles trained fused; ``measure``: each bundle times
both ways in its first steps and keeps the faster), all from fresh run directories, the modes'
order rotated from one of `--runs` rounds to the next. Per mode: the median makespan (the
job's, as results.json has it), wall time of the command and CPU seconds of the trainers'
steps (the epoch reports' `cpu`: what the training cost whatever else loads the machine, which
stretches wall time only), and what `measure` kept (`bundle_decided`); then always / never and
measure / never (issue 49's CPU line: at most 1.05x never; `auto` forms no bundles on CPU).

Usage: .venv/bin/python bench/fused.py [--device cpu|cuda] [--families cnn resnet] [--members 8]
       [--steps 10] [--repeats 5] [--batch 64] [--shape 3 32 32] [--threads 1] [--json out.json]
       .venv/bin/python bench/fused.py --runtime [--members 8] [--epochs 2] [--samples 2000] [--slots 1]
       [--batch 64] [--shape 3 32 32] [--threads 1] [--runs 1] [--modes never,always,measure]
       [--policy fleet-g] [--timeout 1800] [--keep DIR] [--json out.json]
Prints a table per family (or the runtime's table) and, with --json, writes the figures. With
the defaults on one thread of a 2-core VM it takes about 4 minutes; `--steps 2 --repeats 2
--batch 16 --shape 3 16 16` takes seconds. `--runtime --samples 800 --shape 3 16 16 --epochs 1`
takes about a minute a mode.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
import yaml

from _harness import at_least, fleet_run, name_list, work_dir
from fleet.engines import EngineOptions
from fleet.engines.torch import TorchEngine
from fleet.engines.torch.fused import FusedTorchEngine
from fleet.spec import ModelSpec, TrainSpec

PARAMS: dict[str, dict] = {
    "cnn": {"channels": [16, 32], "hidden": 64},
    "resnet": {"blocks": [1, 1, 1, 1], "width": 8},
    "densenet": {"blocks": [2, 2, 2], "growth_rate": 8},
    "mlp": {"hidden": [512, 256]},
}
LR_STEP = 1.35
CONTENDERS = ("fused", "one by one")
MODES = ("never", "always", "measure")  # runtime.fuse, in the order of the first round


def members(family: str, count: int, lr: float, batch: int) -> list[ModelSpec]:
    """`count` learning-rate variants of the family's bench architecture."""
    return [ModelSpec(id=f"{family}-{k:03d}", family=family, params=PARAMS[family], seed=11 + k,
                      train=TrainSpec(lr=lr * LR_STEP**k, momentum=0.9, batch_size=batch)) for k in range(count)]


def batches(args: argparse.Namespace) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(0)
    return [(rng.standard_normal((args.batch, *args.shape)).astype(np.float32),
             rng.integers(0, args.classes, args.batch)) for _ in range(args.batches)]


def contender(name: str, models: list[ModelSpec], args: argparse.Namespace):
    """A step function training `models` on one batch: one bundle (``fused``) or each engine in turn."""
    options = [EngineOptions(m, tuple(args.shape), args.classes, device=args.device, threads=args.threads)
               for m in models]
    if name == "fused":
        bundle = FusedTorchEngine(options)
        return bundle.train_step
    engines = [TorchEngine(o) for o in options]
    return lambda x, y: [engine.train_step(x, y) for engine in engines]


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed_block(step, data, args: argparse.Namespace) -> float:
    """Seconds of `args.steps` steps (cycling `data`), synchronised on CUDA."""
    synchronize(args.device)
    start = time.perf_counter()
    for k in range(args.steps):
        step(*data[k % len(data)])
    synchronize(args.device)
    return time.perf_counter() - start


def throughput(family: str, args: argparse.Namespace) -> dict:
    """Median member-samples/s of both contenders over interleaved blocks, and their spreads
    (``one by one``: one engine per member, each block all of one member's steps, then the next's)."""
    models, data = members(family, args.members, args.lr, args.batch), batches(args)
    fused = contender("fused", models, args)
    alone = [contender("one by one", [m], args) for m in models]
    for k in range(args.warmup):
        fused(*data[k % len(data)])
        for step in alone:
            step(*data[k % len(data)])
    seconds: dict[str, list[float]] = {name: [] for name in CONTENDERS}
    for block in range(args.repeats):
        for name in (CONTENDERS if block % 2 == 0 else CONTENDERS[::-1]):
            if name == "fused":
                seconds[name].append(timed_block(fused, data, args))
            else:
                seconds[name].append(sum(timed_block(step, data, args) for step in alone))
    samples = args.members * args.batch * args.steps
    return {name: {"samples_per_s": samples / statistics.median(values),
                   "min_max": [samples / max(values), samples / min(values)]} for name, values in seconds.items()}


def peak_memory(family: str, name: str, args: argparse.Namespace) -> float:
    """MiB at the peak of a child process that trains only `name` (the bundle, or one member)."""
    command = [sys.executable, __file__, "--memory-of", family, name, *sys.argv[1:]]
    found = subprocess.run(command, capture_output=True, text=True, check=True, timeout=600)
    return float(found.stdout.strip().splitlines()[-1])


def measure_memory(family: str, name: str, args: argparse.Namespace) -> float:
    """In the child: the contender's peak MiB (see the module docstring)."""
    models, data = members(family, args.members, args.lr, args.batch), batches(args)
    if name != "fused":
        models = models[:1]
    cuda = args.device.startswith("cuda")
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    before = resident_kib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM, the peak resident set, to now
    step = contender(name, models, args)
    for k in range(args.warmup + args.steps):
        step(*data[k % len(data)])
    if cuda:
        synchronize(args.device)
        return torch.cuda.max_memory_allocated() / 2**20
    return (resident_kib("VmHWM") - before) / 1024


def resident_kib(field: str) -> int:
    """A field of /proc/self/status in KiB (Linux): VmRSS now, VmHWM the peak since the last reset."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def device_name(device: str) -> str:
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    return f"{platform.machine()} CPU ({platform.processor() or 'unknown'}), {torch.get_num_threads()} thread(s)"


def report(family: str, figures: dict, memory: dict, args: argparse.Namespace) -> None:
    fused, alone = figures["fused"], figures["one by one"]
    print(f"\n{family} ({json.dumps(PARAMS[family])}), {args.members} lr variants, batch {args.batch}, "
          f"shape {tuple(args.shape)}")
    print(f"  {'contender':<12} {'samples/s':>10} {'(min-max)':>19} {'peak MiB':>9}")
    for name in CONTENDERS:
        low, high = figures[name]["min_max"]
        print(f"  {name:<12} {figures[name]['samples_per_s']:>10.0f} {f'({low:.0f}-{high:.0f})':>19} "
              f"{memory[name]:>9.1f}")
    print(f"  fused / one by one: {fused['samples_per_s'] / alone['samples_per_s']:.2f}x throughput; "
          f"memory {memory['fused']:.1f} MiB for the bundle against {memory['one by one']:.1f} MiB per member")


def runtime_spec(mode: str, args: argparse.Namespace) -> dict:
    """The spec of the `--runtime` sweep with `runtime.fuse: mode` (see the module docstring)."""
    channels, height, width = args.shape
    models = [{"family": "cnn", "name": m.id, "params": json.loads(json.dumps(m.params)),  # no YAML aliases
               "train": {"lr": m.train.lr}} for m in members("cnn", args.members, args.lr, args.batch)]
    return {"name": f"fused-{mode}", "seed": 0,
            "data": {"source": "synthetic", "samples": args.samples, "image_size": [height, width],
                     "channels": channels, "classes": args.classes, "val_fraction": 0.1},
            "models": models,
            "train": {"batch_size": args.batch, "max_epochs": args.epochs, "optimizer": "sgd", "momentum": 0.9,
                      "stop": {"patience": 1000}},
            "scheduler": {"policy": args.policy, "profile": False},
            "cluster": {"nodes": 1, "gpus_per_node": args.slots, "preprocessors_per_node": 1, "device": "cpu",
                        "threads_per_trainer": args.threads},
            "runtime": {"fuse": mode}}


def runtime_run(mode: str, round_index: int, root: Path, args: argparse.Namespace) -> dict:
    """One `fleet run` of the sweep: its makespan, wall seconds and `measure`'s decisions."""
    spec = root / f"{mode}-{round_index}.yaml"
    spec.write_text(yaml.safe_dump(runtime_spec(mode, args)))
    run_dir = root / f"run-{mode}-{round_index}"
    run = fleet_run(spec, run_dir, args.timeout, what=f"fleet run (runtime.fuse {mode})")
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    decided = [{k: e[k] for k in ("models", "fused_step_s", "one_by_one_step_s", "kept")}
               for e in events if e["event"] == "bundle_decided"]
    bundles = [e["models"] for e in events if e["event"] == "bundle_formed"]
    return {"makespan_s": run.results["makespan_s"], "wall_s": run.wall_s, "bundles": bundles, "decided": decided,
            "step_cpu_s": step_cpu_s(events)}


def step_cpu_s(events: list[dict]) -> float:
    """CPU seconds the trainers spent in training steps (each epoch report's, a bundle's once per
    epoch): the training's cost without the machine's load, which stretches wall time only."""
    seen, total = set(), 0.0
    for event in events:
        if event["event"] != "epoch":
            continue
        key = (tuple(event.get("bundle") or (event["model"],)), event["epoch"], event["stream"])
        if key not in seen:
            seen.add(key)
            total += event["cpu"][0]
    return total


def runtime_sweep(args: argparse.Namespace) -> dict:
    """Every mode of `--modes` in `--runs` rounds (the order rotated each round); per mode its runs."""
    runs: dict[str, list[dict]] = {mode: [] for mode in args.modes}
    with work_dir(args.keep) as root:
        for index in range(args.runs):
            shift = index % len(args.modes)
            for mode in args.modes[shift:] + args.modes[:shift]:
                runs[mode].append(runtime_run(mode, index, root, args))
                print(f"  round {index + 1}, fuse {mode}: makespan {runs[mode][-1]['makespan_s']:.1f} s", flush=True)
    return runs


def runtime_report(runs: dict[str, list[dict]], args: argparse.Namespace) -> dict:
    """Prints the runtime table and returns its figures."""
    print(f"\nfleet run: {args.members} CNN lr variants ({json.dumps(PARAMS['cnn'])}), {args.epochs} epoch(s), "
          f"{args.samples} synthetic {tuple(args.shape)} images, batch {args.batch}, {args.slots} cpu slot(s) x "
          f"{args.threads} thread(s), policy {args.policy}, {args.runs} round(s)")
    print(f"  {'runtime.fuse':<13} {'makespan s':>11} {'wall s':>8} {'step CPU s':>11}  bundles / kept")
    figures = {}
    for mode, done in runs.items():
        makespan = statistics.median(r["makespan_s"] for r in done)
        wall = statistics.median(r["wall_s"] for r in done)
        cpu = statistics.median(r["step_cpu_s"] for r in done)
        kept = sorted({d["kept"] for r in done for d in r["decided"]})
        sizes = sorted({len(b) for r in done for b in r["bundles"]})
        how = f"{len(done[0]['bundles'])} of {'/'.join(map(str, sizes))}" if sizes else "none"
        print(f"  {mode:<13} {makespan:>11.1f} {wall:>8.1f} {cpu:>11.1f}  {how}"
              f"{'; kept ' + ', '.join(kept) if kept else ''}")
        figures[mode] = {"makespan_s": makespan, "wall_s": wall, "step_cpu_s": cpu, "runs": done}
    for mode in ("always", "measure"):
        if mode in figures and "never" in figures:
            ratio = figures[mode]["makespan_s"] / figures["never"]["makespan_s"]
            cpu_ratio = figures[mode]["step_cpu_s"] / figures["never"]["step_cpu_s"]
            print(f"  {mode} / never: {ratio:.2f}x makespan, {cpu_ratio:.2f}x step CPU")
            figures[f"{mode}/never"] = {"makespan": ratio, "step_cpu": cpu_ratio}
    for r in runs.get("measure", []):
        for d in r["decided"]:
            print(f"  measure's trial: {len(d['models'])} models, a step {d['fused_step_s'] * 1e3:.1f} ms fused, "
                  f"{d['one_by_one_step_s'] * 1e3:.1f} ms one by one: kept {d['kept']}")
    return figures


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--families", nargs="+", default=["cnn", "resnet"], choices=sorted(PARAMS))
    parser.add_argument("--members", type=int, default=8)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--shape", type=int, nargs=3, default=[3, 32, 32])
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--memory-of", nargs=2, metavar=("FAMILY", "CONTENDER"), help=argparse.SUPPRESS)
    runtime = parser.add_argument_group("--runtime: the sweep as a real fleet run on CPU")
    runtime.add_argument("--runtime", action="store_true")
    runtime.add_argument("--epochs", type=at_least(1), default=2)
    runtime.add_argument("--samples", type=at_least(20), default=2000)
    runtime.add_argument("--slots", type=at_least(1), default=1)
    runtime.add_argument("--runs", type=at_least(1), default=1)
    runtime.add_argument("--modes", type=name_list(MODES, "runtime.fuse mode"), default=list(MODES))
    runtime.add_argument("--policy", default="fleet-g")
    runtime.add_argument("--timeout", type=float, default=1800.0)
    runtime.add_argument("--keep")
    return parser.parse_args(argv)


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    if args.memory_of:
        print(measure_memory(*args.memory_of, args))
        return
    print(f"bench/fused.py on {device_name(args.device)}, torch {torch.__version__}")
    if args.runtime:
        figures = runtime_report(runtime_sweep(args), args)
        if args.json:
            args.json.write_text(json.dumps({"device": device_name("cpu"), "args": vars(args) | {"json": str(args.json)},
                                             "runtime": figures}, indent=2))
        return
    results = {}
    for family in args.families:
        figures = throughput(family, args)
        memory = {name: peak_memory(family, name, args) for name in CONTENDERS}
        report(family, figures, memory, args)
        results[family] = {"throughput": figures, "peak_mib": memory}
    if args.json:
        args.json.write_text(json.dumps({"device": device_name(args.device), "args": vars(args) | {"json": str(args.json)},
                                         "results": results}, indent=2))


if __name__ == "__main__":
    main()
