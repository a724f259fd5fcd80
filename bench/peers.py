"""Fleet against what users run today: per-model processes, Ray Tune and `fleet run`, one invocation.

What: the ensemble, data and transforms of `bench/e2e_cpu.py` (8 CNN architectures, each at
`--sweep` learning rates: the default 4 is the 32-model sweep), every model trained for exactly
`--epochs` epochs, on the same number of slots N (`--slots`) by each contender:

- processes: one new Python process per model, N at a time, as a Slurm job array or
  `xargs -P N` runs them. Each process trains its model with the plain PyTorch loop of
  `bench/plain_loop.py` and decodes its own JPEGs with its own DataLoader: its training set
  every epoch, its validation set once (when it opens the data).
- pool: N long-lived Python processes (a `multiprocessing` pool, or N job steps that each
  loop over a share of the models), each opening the data once and then training models one
  after another with the same plain loop, in the spec's order: the processes' training and
  decoding without a new interpreter, torch import and validation set per model.
- ray: Ray Tune, N concurrent trials of 1 CPU each, a trial training one model with the same
  plain loop, from a driver process the bench starts (so Ray's imports and `ray.init` count).
  Ray is a dependency of this bench only (`.venv/bin/pip install 'ray[tune]'`); without it the
  contender is skipped with a note.
- fleet: `fleet run` with `scheduler.policy: auto` and `scheduler.profile: auto` (the
  defaults), from a fresh run directory every time, so its profiling (when it chooses to
  profile), planning and start-up are paid each time; one node of N CPU trainer slots plus
  `--preprocessors` preprocessor ranks. The peers run N processes at a time, fleet N trainers
  and its preprocessor(s): N + P ranks.
- fleet-profiled: the same with `scheduler.profile: true`: it measures every model's rates
  before training (the default until 2026-11-26).
- fleet-baseline: the same with `scheduler.policy: baseline` (`profile: auto` then does not
  profile: its plans read no rate), fleet's stand-in for the processes: each model alone on a slot, decoding its
  own data in its trainer process; fleet's "x Baseline" figures mean something only if this
  row is close to the peers' (the pool's, whose processes also live for the whole job).

How: every contender uses `--threads` torch threads per slot, and its wall time runs from its
first process's launch to its last process's exit, start-up and shutdown included. The
contenders alternate (processes, pool, fleet, ray, fleet-profiled, fleet-baseline, processes,
...) for `--rounds` rounds, so drift in the machine's load falls on all of them; the table
gives the median wall time and each round's, the JPEGs decoded (fleet: its training streams plus every trainer's validation set, as
results.json counts them, profiling not included), the mean best validation accuracy over the
models, and each peer's wall time over fleet's (above 1: fleet is faster). Fleet's wall time is
also split into phases that add up to it: launch (the CLI, mpiexec, imports and MPI start-up,
until the ranks' clock starts), profiling (profile.json), the rest of the ranks' start-up
(results.json's `overhead_s.startup`, which includes profiling, less profiling), the training
makespan, and what follows it (the report, shutdown; from events.jsonl's `run_end`). For the
processes, the mean of each process's wall time outside `train_model` (interpreter, imports,
reading the data, decoding the validation set); for the pool, its workers' mean time outside
training; for Ray, `ray.init` and `Tuner.fit` seconds.

`--setting decode-heavy` puts 256-pixel JPEGs on disk (the default `light`: 96), so that
decoding dominates; `--source-size` sets the side directly. `--keep DIR` keeps the data (reused
by a later invocation with the same samples and side) and every round's run directory there;
`--json FILE` writes the settings, the summary and every round's figures.

Usage: .venv/bin/python bench/peers.py [--sweep 4] [--epochs 2] [--samples 3000] [--slots 4]
       [--setting light|decode-heavy] [--source-size PX] [--image-size 24] [--preprocessors 1]
       [--threads 1] [--rounds 1] [--contenders processes,pool,fleet,ray,fleet-profiled,fleet-baseline]
       [--timeout 3600]
       [--keep DIR] [--json FILE]
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace

import yaml

from _harness import at_least, fleet_run, jpeg_folder, name_list, run_to_end, work_dir
from e2e_cpu import MODELS, models_for, spec_for  # bench/e2e_cpu.py, beside this script

BENCH = Path(__file__).resolve().parent
PLAIN_LOOP = BENCH / "plain_loop.py"
CONTENDERS = ("processes", "pool", "fleet", "ray", "fleet-profiled", "fleet-baseline")  # the order of each round
FLEETS = ("fleet", "fleet-profiled")  # the rows the others are compared with
FLEET_RUNS = (*FLEETS, "fleet-baseline")  # the rows with fleet's phases
SOURCE_SIZES = {"light": 96, "decode-heavy": 256}  # --setting: the side of the JPEGs on disk
WAIT_TIMEOUT_S = 600  # fleet's runtime.timeout_s: how long a rank waits before it aborts the job
RAY_DRIVER = "import peers; peers.ray_driver()"  # the Ray contender's process (`python -c`)
POOL_DRIVER = "import peers; peers.pool_driver()"  # the pool contender's process


@dataclass(frozen=True)
class Outcome:
    """One contender's run: wall seconds, JPEGs decoded, mean best validation accuracy, and
    figures of its own (`details`)."""

    wall_s: float
    decoded: int
    accuracy: float
    details: dict = field(default_factory=dict)


# ----------------------------------------------------------------------------- the shared setting


def source_size(args) -> int:
    return args.source_size or SOURCE_SIZES[args.setting]


def make_data(root: Path, args) -> Path:
    """The synthetic JPEG folder (reused from a kept directory when made there before)."""
    return jpeg_folder(root / f"images-{args.samples}x{source_size(args)}px", args.samples, source_size(args))


def write_spec(root: Path, data: Path, args) -> Path:
    """The one spec every contender reads: e2e_cpu's, with `scheduler.policy: auto` and N
    trainer slots (the peers use its data, transforms, models and training only)."""
    e2e_args = SimpleNamespace(trainers=args.slots, preprocessors=args.preprocessors, threads=args.threads,
                               wait_timeout=WAIT_TIMEOUT_S, runtime=[], sweep=args.sweep, epochs=args.epochs,
                               image_size=args.image_size)
    doc = {**spec_for("auto", data, e2e_args), "name": "peers"}
    path = root / "peers.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def model_seeds(spec_path: Path) -> list[int]:
    """Each model's own seed, which the peers also use for data order and augmentation."""
    from fleet.spec import load_spec  # fleet kept out of the imports of this module, which the drivers import

    return [model.seed for model in load_spec(str(spec_path)).models]


def mean_accuracy(models: list[dict]) -> float:
    return statistics.fmean(model["best_val_accuracy"] for model in models)


def fresh_dir(path: Path) -> Path:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


# ----------------------------------------------------------------------------- the contenders


def run_processes(spec_path: Path, seeds: list[int], work: Path, args) -> Outcome:
    """One `plain_loop.py` process per model, `--slots` at a time (as `xargs -P N`)."""

    def one(index: int) -> float:
        command = [sys.executable, str(PLAIN_LOOP), str(spec_path), "--model", str(index), "--seed",
                   str(seeds[index]), "--threads", str(args.threads), "--json", str(work / f"{index}.json")]
        return run_to_end(command, f"the process of model {index}", args.timeout).wall_s

    started = time.perf_counter()
    with ThreadPoolExecutor(args.slots) as pool:
        process_walls = list(pool.map(one, range(len(seeds))))
    wall = time.perf_counter() - started
    models = [json.loads((work / f"{index}.json").read_text()) for index in range(len(seeds))]
    outside = [process - model["seconds"] for process, model in zip(process_walls, models)]
    return Outcome(wall, sum(m["samples_decoded"] for m in models), mean_accuracy(models),
                   {"process_overhead_s": statistics.fmean(outside)})


def run_pool(spec_path: Path, seeds: list[int], work: Path, args) -> Outcome:
    """`--slots` long-lived plain-loop processes (`pool_driver`), started by a process of its
    own so that its interpreter and imports count as the others' do."""
    out = work / "pool.json"
    wall = run_driver(POOL_DRIVER, [spec_path, args.slots, args.threads, json.dumps(seeds), out], "the pool",
                      args.timeout)
    models = json.loads(out.read_text())
    busy = sum(model["seconds"] for model in models) / min(args.slots, len(models))
    return Outcome(wall, sum(m["samples_decoded"] for m in models), mean_accuracy(models),
                   {"worker_overhead_s": wall - busy})


def bench_env() -> dict:
    """The environment of a driver process that imports this script's modules (`python -c`
    puts the current directory, not `bench/`, on sys.path)."""
    path = os.pathsep.join(filter(None, [str(BENCH), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path}


def run_driver(code: str, arguments: list, what: str, timeout: float) -> float:
    """The wall seconds of `python -c CODE ARGUMENTS` (a driver process that imports this
    script's modules, `bench_env`) run to its end (`run_to_end`: a failure ends the bench)."""
    command = [sys.executable, "-c", code, *map(str, arguments)]
    return run_to_end(command, what, timeout, env=bench_env()).wall_s


def peer_missing(module: str, install: str) -> bool:
    """True (after a note on how to install it) when a peer's `module` cannot be imported;
    `install` is what to give pip."""
    try:
        importlib.import_module(module)  # an optional heavy dependency, the benches' only
    except ImportError:
        print(f"{module}: not installed, skipped (install it with: .venv/bin/pip install {install})", flush=True)
        return True
    return False


def ray_missing() -> bool:
    """True (after a note on how to install it) when Ray cannot be imported."""
    return peer_missing("ray", "'ray[tune]'")


def run_ray(spec_path: Path, seeds: list[int], work: Path, args) -> Outcome:
    """Ray Tune in a process of its own (`ray_driver`), so its start-up counts as the others' does."""
    out = work / "tune.json"
    wall = run_driver(RAY_DRIVER, [spec_path, args.slots, args.threads, json.dumps(seeds), work, out], "Ray Tune",
                      args.timeout)
    tune_run = json.loads(out.read_text())
    models = tune_run.pop("models")
    return Outcome(wall, sum(m["samples_decoded"] for m in models), mean_accuracy(models), tune_run)


def run_fleet(spec_path: Path, seeds: list[int], work: Path, args) -> Outcome:
    """`fleet run` from a fresh run directory (`work`), as the spec says (`scheduler.profile:
    auto`: it profiles first only when that is predicted to cost little beside the training)."""
    return fleet_outcome(spec_path, work, args)


def run_fleet_profiled(spec_path: Path, seeds: list[int], work: Path, args) -> Outcome:
    """`fleet run` with `scheduler.profile: true`: it measures every model's rates first."""
    return fleet_outcome(spec_with(spec_path, "profiled", profile=True), work, args)


def run_fleet_baseline(spec_path: Path, seeds: list[int], work: Path, args) -> Outcome:
    """`fleet run` with `scheduler.policy: baseline`: every model decodes its own data."""
    return fleet_outcome(spec_with(spec_path, "baseline", policy="baseline"), work, args)


def spec_with(spec_path: Path, name: str, **scheduler) -> Path:
    """A copy of the spec beside it with these `scheduler` keys."""
    doc = yaml.safe_load(spec_path.read_text())
    doc["scheduler"].update(scheduler)
    path = spec_path.with_name(f"peers-{name}.yaml")
    path.write_text(yaml.safe_dump(doc))
    return path


def fleet_outcome(spec_path: Path, work: Path, args) -> Outcome:
    launched = time.time()
    run = fleet_run(spec_path, work, args.timeout)
    results, wall = run.results, run.wall_s
    predictions = results["policy_choice"].get("predicted_makespan_s", {})  # per candidate, under policy auto
    details = {**fleet_phases(work, results, launched, launched + wall), "policy": results["policy"],
               "predicted_s": predictions.get(results["policy"]), "predictions_s": predictions}
    decoded = results["samples_decoded"] + results["validation_samples_decoded"]
    return Outcome(wall, decoded, mean_accuracy(results["models"]), details)


def fleet_phases(work: Path, results: dict, launched: float, ended: float) -> dict:
    """Fleet's wall time in phases that add up to it: launch (the CLI, mpiexec, imports and
    MPI start-up, until the ranks' clock starts), profiling, the rest of the start-up (data,
    warm-up, planning), the training makespan (its first part: to the first training batch),
    and what follows (the report, shutdown)."""
    from fleet.runtime.events import first_batch_s, read_events  # fleet kept out of this module's imports

    every = read_events(work / "events.jsonl")
    events = [e for e in every if e["event"] in ("run_start", "run_end")]
    run_start = next(e for e in events if e["event"] == "run_start")
    run_end = next(e for e in events if e["event"] == "run_end")
    profile = work / "profile.json"
    profiling = json.loads(profile.read_text())["profiler"]["seconds"] if profile.exists() else 0.0
    startup = results["overhead_s"]["startup"]
    first_batch = first_batch_s(every) or 0.0  # also of runs from before results.json held it
    phases = {"launch_s": run_start["time"] - startup - launched, "profiling_s": profiling,
              "startup_s": startup - profiling, "first_batch_s": first_batch, "makespan_s": results["makespan_s"],
              "after_s": ended - run_end["time"]}
    phases["outside_training_s"] = phases["launch_s"] + startup + first_batch + phases["after_s"]
    return phases


RUNNERS = {"processes": run_processes, "pool": run_pool, "fleet": run_fleet, "ray": run_ray,
           "fleet-profiled": run_fleet_profiled, "fleet-baseline": run_fleet_baseline}


# ----------------------------------------------------------------------------- the pool's and Ray Tune's processes


def pool_driver() -> None:
    """`python -c POOL_DRIVER SPEC SLOTS THREADS SEEDS OUT`: SLOTS spawned worker processes
    train every model of SPEC with the plain loop, in the spec's order; OUT gets the results."""
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    from plain_loop import worker_init, worker_train

    spec, slots, threads, seeds, out = sys.argv[1:]
    seeds = json.loads(seeds)
    with ProcessPoolExecutor(int(slots), mp_context=get_context("spawn"), initializer=worker_init,
                             initargs=(spec, int(threads))) as pool:
        models = list(pool.map(worker_train, range(len(seeds)), seeds))
    Path(out).write_text(json.dumps(models))


def tune_trial(config: dict) -> None:
    """A Ray Tune trial: one model of the spec, trained by the plain loop in this worker."""
    from plain_loop import train_one  # imports torch, which only the trials need
    from ray import tune  # optional heavy dependency, this bench's only

    index = config["index"]
    result = train_one(config["spec"], index, config["seeds"][index], config["threads"])
    kept = ("id", "epochs", "best_val_accuracy", "seconds", "samples_decoded")
    tune.report({"index": index, **{key: result[key] for key in kept}})


def ray_driver() -> None:
    """`python -c RAY_DRIVER SPEC SLOTS THREADS SEEDS STORAGE OUT`: Ray Tune trains every model
    of SPEC, SLOTS trials at a time; OUT gets the trials' results and Ray's own seconds."""
    from ray import tune  # optional heavy dependency, this bench's only

    spec, slots, threads, seeds, storage, out = sys.argv[1:]
    seeds, slots = json.loads(seeds), int(slots)
    space = {"spec": spec, "threads": int(threads), "seeds": seeds, "index": tune.grid_search(list(range(len(seeds))))}
    fitted = tune_fit(tune_trial, space, storage, "peers", slots=slots, cpus=slots, trial_cpus=1)
    Path(out).write_text(json.dumps(fitted))


def tune_fit(trainable, space: dict, storage: str, name: str, slots: int, cpus: int, trial_cpus: float,
             scheduler=None, search_alg=None, num_samples: int = 1) -> dict:
    """Ray Tune in this process: `ray.init(num_cpus=cpus)`, then `trainable` over `space`, at
    most `slots` trials at a time of `trial_cpus` CPUs each, under Tune's `scheduler` (None: its
    default, first in first out); experiment `name` under `storage`. With `search_alg` (a Tune
    searcher, e.g. Optuna's TPE), `num_samples` trials asked from it.

    Returns:
        ``init_s`` and ``fit_s`` (ray.init's and Tuner.fit's seconds) and ``models``: each
        trial's last reported metrics, in the order of their ``index``. A failed trial ends the
        process with a message.
    """
    import ray  # optional heavy dependency, the benches' only
    from ray import tune

    started = time.perf_counter()
    ray.init(num_cpus=cpus)
    init_s = time.perf_counter() - started
    tuner = tune.Tuner(tune.with_resources(trainable, {"cpu": trial_cpus}), param_space=space,
                       tune_config=tune.TuneConfig(max_concurrent_trials=slots, scheduler=scheduler,
                                                   search_alg=search_alg, num_samples=num_samples),
                       run_config=tune.RunConfig(name=name, storage_path=storage, verbose=0))
    grid = tuner.fit()
    fit_s = time.perf_counter() - started - init_s
    errors = [str(result.error) for result in grid if result.error]
    if errors:
        sys.exit(f"{len(errors)} trial(s) failed; the first: {errors[0]}")
    models = sorted((result.metrics for result in grid), key=lambda metrics: metrics["index"])
    ray.shutdown()
    return {"init_s": init_s, "fit_s": fit_s, "models": models}


# ----------------------------------------------------------------------------- the report


def summary(rounds: list[dict[str, Outcome]], contenders: list[str]) -> dict:
    """Per contender: median and per-round wall seconds, decoded, accuracy, and peer/fleet."""
    rows = {}
    for name in contenders:
        outcomes = [one[name] for one in rounds]
        rows[name] = {"wall_s": statistics.median(o.wall_s for o in outcomes), "walls_s": [o.wall_s for o in outcomes],
                      "decoded": int(statistics.median(o.decoded for o in outcomes)),
                      "accuracy": statistics.median(o.accuracy for o in outcomes)}
    for row in rows.values():
        row["vs"] = {fleet: row["wall_s"] / rows[fleet]["wall_s"] for fleet in FLEETS if fleet in rows}
    return rows


def print_table(rows: dict, args, models: int) -> None:
    print(f"{models} models ({len(MODELS)} CNNs x {args.sweep} learning rate(s)) x {args.epochs} epoch(s) on "
          f"{args.samples} JPEGs ({source_size(args)} px on disk, {args.image_size} px trained; setting "
          f"{args.setting}), {args.slots} slots of {args.threads} torch thread(s): processes, pool and ray run "
          f"{args.slots} processes at a time, fleet {args.slots} trainers + {args.preprocessors} preprocessor(s)")
    fleets = [fleet for fleet in FLEETS if fleet in rows]
    print(f"{'contender':<16}{'wall s':>9}  {'each round s':<24}{'decoded':>11}{'mean best acc':>15}"
          + "".join(f"{'vs ' + fleet:>22}" for fleet in fleets))
    for name, row in rows.items():
        walls = ", ".join(f"{w:.1f}" for w in row["walls_s"])
        ratios = "".join(f"{'-' if name == fleet else format(row['vs'][fleet], '.2f') + 'x':>22}" for fleet in fleets)
        print(f"{name:<16}{row['wall_s']:>9.1f}  {walls:<24}{row['decoded']:>11,}{row['accuracy']:>15.3f}{ratios}")
    for peer in (peer for peer in ("processes", "pool") if peer in rows and "fleet-baseline" in rows):
        ratio = rows["fleet-baseline"]["wall_s"] / rows[peer]["wall_s"]
        print(f"fleet-baseline's wall / the {peer}': {ratio:.2f} (target: within 10%, 0.90-1.10)")
    print("wall: median over rounds, launch to last exit; vs fleet: the contender's wall / that fleet's (above 1: "
          "fleet is faster); fleet-profiled: scheduler.profile true; fleet-baseline: scheduler.policy baseline")


def print_details(rounds: list[dict[str, Outcome]]) -> None:
    for k, one in enumerate(rounds, start=1):
        for fleet in (fleet for fleet in FLEET_RUNS if fleet in one):
            d = one[fleet].details
            predicted = "" if d["predicted_s"] is None else f", predicted {d['predicted_s']:.1f} s"
            print(f"round {k} {fleet}: launch {d['launch_s']:.1f} s, profiling {d['profiling_s']:.1f} s, rest of "
                  f"start-up {d['startup_s']:.1f} s, to the first batch {d['first_batch_s']:.1f} s (of the "
                  f"training makespan {d['makespan_s']:.1f} s), after training (report, shutdown) {d['after_s']:.1f} s: "
                  f"{d['outside_training_s']:.1f} s outside training; policy {d['policy']}{predicted}")
        if "processes" in one:
            print(f"round {k} processes: each process's wall outside training (start-up, data, validation set) "
                  f"{one['processes'].details['process_overhead_s']:.1f} s on average")
        if "pool" in one:
            print(f"round {k} pool: wall less each worker's mean time training (its start-up, data, validation "
                  f"set, idle at the end) {one['pool'].details['worker_overhead_s']:.1f} s")
        if "ray" in one:
            d = one["ray"].details
            print(f"round {k} ray: ray.init {d['init_s']:.1f} s, Tuner.fit {d['fit_s']:.1f} s")


# ----------------------------------------------------------------------------- main


def add_setting_arguments(parser: argparse.ArgumentParser) -> None:
    """The options that `make_data` and `write_spec` read: the data, the slots and their threads."""
    parser.add_argument("--samples", type=at_least(2), default=3000)
    parser.add_argument("--slots", type=at_least(1), default=4, help="concurrent trainers N of every contender")
    parser.add_argument("--setting", choices=tuple(SOURCE_SIZES), default="light",
                        help="light: 96 px JPEGs on disk; decode-heavy: 256 px, so decoding dominates")
    parser.add_argument("--source-size", type=at_least(1), help="side of the JPEGs on disk (overrides --setting)")
    parser.add_argument("--image-size", type=at_least(1), default=24, help="side the models train on")
    parser.add_argument("--preprocessors", type=at_least(1), default=1, help="fleet's preprocessor ranks")
    parser.add_argument("--threads", type=at_least(1), default=1, help="torch threads per slot, every contender")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", type=int, default=4, choices=range(1, 5), metavar="K",
                        help="train each of the 8 architectures at K learning rates (1-4; default 4: 32 models)")
    parser.add_argument("--epochs", type=at_least(1), default=2)
    add_setting_arguments(parser)
    parser.add_argument("--rounds", type=at_least(1), default=1, help="times each contender runs, alternating")
    parser.add_argument("--contenders", type=name_list(CONTENDERS, "contender"), default=list(CONTENDERS),
                        help=f"comma-separated, from {','.join(CONTENDERS)} (default: all)")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds one command may take")
    parser.add_argument("--keep", metavar="DIR", help="keep the data and every run directory in DIR")
    parser.add_argument("--json", metavar="FILE", help="write every figure to FILE")
    return parser.parse_args()


def run_rounds(spec_path: Path, root: Path, contenders: list[str], args) -> list[dict[str, Outcome]]:
    seeds = model_seeds(spec_path)
    rounds = []
    for k in range(1, args.rounds + 1):
        one = {}
        for name in contenders:
            one[name] = RUNNERS[name](spec_path, seeds, fresh_dir(root / f"{name}-round{k}"), args)
            print(f"round {k}: {name} {one[name].wall_s:.1f} s", flush=True)
        rounds.append(one)
    return rounds


def main() -> None:
    args = parse_args()
    contenders = [name for name in args.contenders if name != "ray" or not ray_missing()]
    if not contenders:
        sys.exit("no contender left to run")
    with work_dir(args.keep) as root:
        spec_path = write_spec(root, make_data(root, args), args)
        rounds = run_rounds(spec_path, root, contenders, args)
    rows = summary(rounds, contenders)
    print_table(rows, args, len(models_for(args.sweep)))
    print_details(rounds)
    if args.json:
        record = {"settings": {**vars(args), "source_size": source_size(args)}, "summary": rows,
                  "rounds": [{name: asdict(outcome) for name, outcome in one.items()} for one in rounds]}
        Path(args.json).write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
