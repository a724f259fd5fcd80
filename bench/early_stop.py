"""Early stopping across models: fleet's `asha` and `sha` against Ray Tune's ASHA and Optuna's successive halving.

What: the 32-configuration sweep of `bench/peers.py` (8 CNN architectures x `--sweep` learning
rates, its synthetic JPEGs, transforms and spec), every model for at most `--epochs` epochs
(default 8: the spec's `train.max_epochs`; its stop rule has `patience: 1000`, so a model that
is not stopped early trains exactly that many), on `--slots` trainer slots (default 4), by:

- fleet: `fleet run` without early stopping (every model trains all its epochs);
- fleet-asha: `fleet run` with `scheduler.early_stop: {method: asha, min_epochs: M,
  reduction: η, metric: val_accuracy}` (`--min-epochs`, default 1; `--reduction`, default 2);
- fleet-sha: the same with `method: sha` (models pause at a rung and the best 1/η are promoted
  from their checkpoints);
- ray-asha: Ray Tune, one trial per configuration, `ASHAScheduler(grace_period=M,
  reduction_factor=η, max_t=--epochs, metric="val_accuracy", mode="max")`, `ray.init(num_cpus=
  the machine's cores)`, each trial cores / slots CPUs, at most `--slots` trials at once; a
  trial trains its model with the plain PyTorch loop of `bench/plain_loop.py` and reports each
  epoch's validation accuracy (`tune.report`);
- optuna-sha: Optuna, `--slots` worker processes sharing one journal file (`JournalStorage(
  JournalFileBackend(...))`), its default sampler, `SuccessiveHalvingPruner(min_resource=M,
  reduction_factor=η)`; the configurations are enqueued (`enqueue_trial`), so each trains once;
  each worker opens the data once and trains trial after trial with the plain loop, calling
  `trial.report(val_accuracy, epoch)` and `trial.should_prune()` after each epoch.

fleet's contenders use `scheduler.policy: auto` and `profile: auto` from a fresh run
directory, so profiling (when it chooses to profile), planning and start-up are paid each time
(one node of `--slots` CPU trainer slots plus `--preprocessors` preprocessor ranks). Every
contender uses `--threads` torch threads per slot.

How: `--seeds K` runs the whole sweep K times, with the spec's seed (which seeds the model
weights, the data order and augmentation, and the train/validation split) 11, 12, ... The
contenders alternate within each seed (fleet, fleet-asha, fleet-sha, ray-asha, optuna-sha), so
drift in the machine's load falls on all of them. Per contender, as means over the seeds: the
wall time from its first process's launch to its last process's exit (start-up, profiling and
shutdown included), the model-epochs trained (all models together), the best validation
accuracy of the sweep and the mean of its 5 best models; then fleet's model-epochs without
early stopping over those with `asha` and with `sha`, and Ray's wall time over fleet-asha's,
against issue 44's targets.

`--simulate` adds the simulator's prediction (`fleet simulate --workload paper100 --noise-model
stop-rule --early-stop METHOD`, the same `--min-epochs` and `--reduction`): each model's true
epochs and metrics follow its stop-rule learning curve, its epoch estimate that x U(0.7, 1.3)
(`--sim-noise`), on 40 and 160 GPUs (`--sim-gpus`), mean of `--seeds` seeds: makespan, GPU
hours and model-epochs of each `--sim-policies` policy with no early stopping and with asha,
sha, hyperband and median. It runs first (seconds); `--contenders none` runs only it. The
prediction is only as good as the curves.

The peers are this bench's only (not in the project's requirements); install them with
    .venv/bin/pip install 'ray[tune]==2.60.0' 'optuna==5.0.0'
A peer that is not installed is skipped with a note. `--keep DIR` keeps the data and every run
directory; `--json FILE` writes the settings, the summary, every run's figures and the
simulator's rows.

Usage: .venv/bin/python bench/early_stop.py [--sweep 4] [--epochs 8] [--min-epochs 1] [--reduction 2]
       [--slots 4] [--seeds 3] [--first-seed 0] [--samples 3000] [--setting light|decode-heavy] [--source-size PX]
       [--image-size 24] [--preprocessors 1] [--threads 1] [--timeout 3600]
       [--contenders fleet,fleet-asha,fleet-sha,ray-asha,optuna-sha|none]
       [--simulate] [--sim-gpus 40,160] [--sim-policies fleet-g,fleet-adaptive] [--sim-noise 0.3]
       [--keep DIR] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

from _harness import at_least, fleet, fleet_run, name_list, work_dir
from peers import (add_setting_arguments, fresh_dir, make_data, model_seeds, peer_missing, run_driver, spec_with,
                   tune_fit, write_spec)

CONTENDERS = ("fleet", "fleet-asha", "fleet-sha", "ray-asha", "optuna-sha")  # the order within each seed
FLEET_METHODS = {"fleet": None, "fleet-asha": "asha", "fleet-sha": "sha"}  # contender -> scheduler.early_stop
PEER_MODULES = {"ray-asha": ("ray", "'ray[tune]==2.60.0'"), "optuna-sha": ("optuna", "'optuna==5.0.0'")}
SIM_METHODS = ("asha", "sha", "hyperband", "median")  # beside none, which every `fleet simulate` row has
TOP = 5  # the best models whose mean accuracy is shown
POINT = 0.01  # one point of accuracy
TARGETS = {"asha": 2.5, "sha": 3.0, "ray": 1.5}  # issue 44: model-epochs saved; Ray's wall over fleet-asha's
RAY_DRIVER = "import early_stop; early_stop.ray_driver()"  # the Ray contender's process (`python -c`)
OPTUNA_DRIVER = "import early_stop; early_stop.optuna_driver()"  # the Optuna contender's process
STUDY = "early-stop"  # the Optuna study's name in its journal


@dataclass(frozen=True)
class Sweep:
    """One contender's run of the sweep: wall seconds, each model's epochs and best validation
    accuracy (in the spec's order), and figures of its own (`details`)."""

    wall_s: float
    epochs: tuple[int, ...]
    accuracies: tuple[float, ...]
    details: dict = field(default_factory=dict)

    @property
    def model_epochs(self) -> int:
        return sum(self.epochs)

    @property
    def best(self) -> float:
        return max(self.accuracies)

    @property
    def top(self) -> float:
        """The mean accuracy of the `TOP` best models."""
        return statistics.fmean(sorted(self.accuracies, reverse=True)[:TOP])

    def record(self) -> dict:
        return {**asdict(self), "model_epochs": self.model_epochs, "best": self.best, "top": self.top}


def sweep_of(wall_s: float, models: list[dict], details: dict) -> Sweep:
    """A `Sweep` from per-model results that carry ``epochs`` and ``best_val_accuracy``."""
    return Sweep(wall_s, tuple(int(m["epochs"]) for m in models), tuple(float(m["best_val_accuracy"]) for m in models),
                 details)


# ----------------------------------------------------------------------------- the sweep's spec


def seed_spec(root: Path, data: Path, args, offset: int) -> Path:
    """peers.py's spec (`write_spec`: its data, transforms, models, `max_epochs: --epochs` and
    `patience: 1000`, policy auto, `--slots` trainer slots) with the spec's seed + `offset`, in a
    folder of its own under `root`."""
    folder = root / f"seed{offset}"
    folder.mkdir(exist_ok=True)
    path = write_spec(folder, data, args)
    doc = yaml.safe_load(path.read_text())
    doc.update(seed=doc["seed"] + offset, name=f"early-stop-seed{offset}")
    path.write_text(yaml.safe_dump(doc))
    return path


def early_stop_section(method: str, args) -> dict:
    return {"method": method, "min_epochs": args.min_epochs, "reduction": args.reduction, "metric": "val_accuracy"}


# ----------------------------------------------------------------------------- the contenders


def run_fleet(name: str, spec_path: Path, work: Path, args) -> Sweep:
    """`fleet run` from a fresh run directory, with the contender's `scheduler.early_stop`."""
    method = FLEET_METHODS[name]
    spec = spec_path if method is None else spec_with(spec_path, method, early_stop=early_stop_section(method, args))
    run = fleet_run(spec, work, args.timeout, what=f"fleet run ({method or 'no early stopping'})")
    details = {"policy": run.results["policy"], "makespan_s": run.results["makespan_s"]}
    return sweep_of(run.wall_s, run.results["models"], details)


def run_ray(name: str, spec_path: Path, work: Path, args) -> Sweep:
    """Ray Tune's ASHA in a process of its own (`ray_driver`), so its start-up counts."""
    out = work / "tune.json"
    arguments = [spec_path, args.slots, args.threads, json.dumps(model_seeds(spec_path)), args.epochs,
                 args.min_epochs, args.reduction, work, out]
    wall = run_driver(RAY_DRIVER, arguments, "Ray Tune (ASHA)", args.timeout)
    tuned = json.loads(out.read_text())
    return sweep_of(wall, tuned.pop("models"), tuned)


def run_optuna(name: str, spec_path: Path, work: Path, args) -> Sweep:
    """Optuna's workers in a process of their own (`optuna_driver`), so their start-up counts."""
    out = work / "optuna.json"
    arguments = [spec_path, args.slots, args.threads, json.dumps(model_seeds(spec_path)), args.min_epochs,
                 args.reduction, work / "journal.log", out]
    wall = run_driver(OPTUNA_DRIVER, arguments, "Optuna (successive halving)", args.timeout)
    studied = json.loads(out.read_text())
    return sweep_of(wall, studied.pop("models"), studied)


RUNNERS = {"fleet": run_fleet, "fleet-asha": run_fleet, "fleet-sha": run_fleet, "ray-asha": run_ray,
           "optuna-sha": run_optuna}


# ----------------------------------------------------------------------------- Ray Tune's process


def asha_trial(config: dict) -> None:
    """A Ray Tune trial: one configuration trained by the plain loop, reporting each epoch's
    validation accuracy (ASHA decides on it) with the epochs and best accuracy so far (a
    stopped trial's last report is its result)."""
    from plain_loop import train_one  # imports torch, which only the trials need
    from ray import tune  # optional heavy dependency, this bench's only

    index, best = config["index"], 0.0

    def report(record: dict) -> bool:
        nonlocal best
        best = max(best, record["val_accuracy"])
        tune.report({"index": index, "epochs": record["epoch"], "val_accuracy": record["val_accuracy"],
                     "best_val_accuracy": best})
        return True  # ASHA stops the trial itself

    train_one(config["spec"], index, config["seeds"][index], config["threads"], on_epoch=report)


def ray_driver() -> None:
    """`python -c RAY_DRIVER SPEC SLOTS THREADS SEEDS MAX_T GRACE ETA STORAGE OUT`: Ray Tune's
    ASHA over every model of SPEC, on all the machine's cores, SLOTS trials at a time of
    cores / SLOTS CPUs each; OUT gets each trial's last report and Ray's own seconds."""
    from ray import tune  # optional heavy dependency, this bench's only
    from ray.tune.schedulers import ASHAScheduler

    spec, slots, threads, seeds, max_t, grace, eta, storage, out = sys.argv[1:]
    seeds, slots, cores = json.loads(seeds), int(slots), len(os.sched_getaffinity(0))
    asha = ASHAScheduler(metric="val_accuracy", mode="max", max_t=int(max_t), grace_period=int(grace),
                         reduction_factor=float(eta))
    space = {"spec": spec, "threads": int(threads), "seeds": seeds, "index": tune.grid_search(list(range(len(seeds))))}
    fitted = tune_fit(asha_trial, space, storage, "early-stop", slots=slots, cpus=cores, trial_cpus=cores / slots,
                      scheduler=asha)
    Path(out).write_text(json.dumps(fitted))


# ----------------------------------------------------------------------------- Optuna's processes


def journal_storage(path: str):
    """The study's storage: one journal file that every worker process appends to."""
    from optuna.storages import JournalStorage  # optional heavy dependency, this bench's only
    from optuna.storages.journal import JournalFileBackend

    return JournalStorage(JournalFileBackend(str(path)))


def halving_pruner(min_resource: int, eta: int):
    from optuna.pruners import SuccessiveHalvingPruner  # optional heavy dependency, this bench's only

    return SuccessiveHalvingPruner(min_resource=min_resource, reduction_factor=eta)


class Pruning:
    """The epoch hook of an Optuna trial: report the epoch's validation accuracy, and stop the
    model when the pruner says so (`pruned`)."""

    def __init__(self, trial):
        self.trial, self.pruned = trial, False

    def __call__(self, record: dict) -> bool:
        self.trial.report(record["val_accuracy"], record["epoch"])
        self.pruned = self.trial.should_prune()
        return not self.pruned


def optuna_driver() -> None:
    """`python -c OPTUNA_DRIVER SPEC SLOTS THREADS SEEDS MIN_RESOURCE ETA JOURNAL OUT`: a study
    in JOURNAL with every model of SPEC enqueued, then SLOTS spawned worker processes
    (`optuna_worker`, data opened once each); OUT gets each trial's result."""
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    import optuna  # optional heavy dependency, this bench's only

    from plain_loop import worker_init  # imports torch

    spec, slots, threads, seeds, min_resource, eta, journal, out = sys.argv[1:]
    seeds, slots, pruner = json.loads(seeds), int(slots), (int(min_resource), int(eta))
    started = time.perf_counter()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name=STUDY, storage=journal_storage(journal), direction="maximize",
                                pruner=halving_pruner(*pruner))
    for index in range(len(seeds)):
        study.enqueue_trial({"index": index})
    setup_s = time.perf_counter() - started
    with ProcessPoolExecutor(slots, mp_context=get_context("spawn"), initializer=worker_init,
                             initargs=(spec, int(threads))) as pool:
        shares = list(pool.map(optuna_worker, [journal] * slots, [seeds] * slots, [pruner] * slots))
    models = sorted((model for share in shares for model in share), key=lambda model: model["index"])
    Path(out).write_text(json.dumps({"setup_s": setup_s, "models": models}))


def optuna_worker(journal: str, seeds: list[int], pruner: tuple[int, int]) -> list[dict]:
    """One worker process (`plain_loop.worker_init` opened its data): trains the enqueued
    trials one after another until none waits; the results of those it trained."""
    import optuna  # optional heavy dependency, this bench's only
    from optuna.trial import TrialState

    from plain_loop import worker_train  # imports torch

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name=STUDY, storage=journal_storage(journal), pruner=halving_pruner(*pruner))
    trained = []
    while study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        trial = study.ask()
        if trial.number >= len(seeds):  # another worker took the last enqueued one meanwhile: a new trial
            study.tell(trial, state=TrialState.FAIL)
            break
        index = trial.suggest_categorical("index", list(range(len(seeds))))
        pruning = Pruning(trial)
        result = worker_train(index, seeds[index], on_epoch=pruning)
        if pruning.pruned:
            study.tell(trial, state=TrialState.PRUNED)
        else:
            study.tell(trial, result["best_val_accuracy"])
        kept = ("epochs", "best_val_accuracy", "seconds")
        trained.append({"index": index, "pruned": pruning.pruned, **{key: result[key] for key in kept}})
    return trained


# ----------------------------------------------------------------------------- the simulator


def simulate(args) -> list[dict]:
    """`fleet simulate --json` on paper100 with stop-rule curves, once per method: the rows of
    each policy with no early stopping (from the first) and with each method."""
    rows = []
    for method in SIM_METHODS:
        command = ["simulate", "--workload", "paper100", "--noise-model", "stop-rule", "--estimate-noise",
                   str(args.sim_noise), "--gpus", ",".join(map(str, args.sim_gpus)), "--policies",
                   ",".join(args.sim_policies), "--seeds", str(args.seeds), "--early-stop", method, "--min-epochs",
                   str(args.min_epochs), "--reduction", str(args.reduction), "--json"]
        found = json.loads(fleet(*command, timeout=args.timeout).stdout)["rows"]
        rows += [{**row, "method": method if "+" in row["policy"] else "none",
                  "policy": row["policy"].partition("+")[0]}
                 for row in found if "+" in row["policy"] or method == SIM_METHODS[0]]
    return sorted(rows, key=lambda row: (row["gpus"], args.sim_policies.index(row["policy"])))


def print_simulated(rows: list[dict], args) -> None:
    print(f"simulated: paper100 (100 models), stop-rule learning curves, epoch estimates x "
          f"U({1 - args.sim_noise:g},{1 + args.sim_noise:g}), min_epochs {args.min_epochs}, reduction "
          f"{args.reduction}; mean of {args.seeds} seed(s)")
    print(f"{'gpus':>5}  {'policy':<16}{'method':<11}{'makespan h':>11}{'GPU h':>10}{'model-epochs':>14}"
          f"{'makespan/none':>15}{'GPU h/none':>12}")
    none = {(row["gpus"], row["policy"]): row for row in rows if row["method"] == "none"}
    for row in rows:
        base = none[row["gpus"], row["policy"]]
        print(f"{row['gpus']:>5}  {row['policy']:<16}{row['method']:<11}{row['makespan_s'] / 3600:>11.2f}"
              f"{row['gpu_hours']:>10.1f}{row['model_epochs']:>14,.0f}{row['makespan_s'] / base['makespan_s']:>15.2f}"
              f"{row['gpu_hours'] / base['gpu_hours']:>12.2f}")
    print("the prediction is only as good as the learning curves (paper100's are the stop-rule noise model's)")


# ----------------------------------------------------------------------------- the report


def summary(runs: list[dict[str, Sweep]], contenders: list[str]) -> dict:
    """Per contender, means over the seeds (and each seed's wall); then the ratios."""
    rows = {}
    for name in contenders:
        sweeps = [run[name] for run in runs]
        rows[name] = {"wall_s": statistics.fmean(s.wall_s for s in sweeps), "walls_s": [s.wall_s for s in sweeps],
                      "model_epochs": statistics.fmean(s.model_epochs for s in sweeps),
                      "best": statistics.fmean(s.best for s in sweeps), "top": statistics.fmean(s.top for s in sweeps)}
    return {"rows": rows, "ratios": ratios(rows)}


def ratios(rows: dict) -> dict:
    """fleet's model-epochs without early stopping over those with asha and sha; Ray's wall
    over fleet-asha's; each where both contenders ran."""
    pairs = {"epochs_fleet_over_asha": ("fleet", "fleet-asha", "model_epochs"),
             "epochs_fleet_over_sha": ("fleet", "fleet-sha", "model_epochs"),
             "wall_ray_over_fleet_asha": ("ray-asha", "fleet-asha", "wall_s")}
    return {key: rows[a][figure] / rows[b][figure] for key, (a, b, figure) in pairs.items() if a in rows and b in rows}


def print_table(report: dict, args, seeds: int, models: int) -> None:
    print(f"{models} configurations, at most {args.epochs} epochs each, min_epochs {args.min_epochs}, reduction "
          f"{args.reduction}, {args.slots} slots of {args.threads} torch thread(s), {args.samples} JPEGs; mean of "
          f"{seeds} seed(s)")
    print(f"{'contender':<13}{'wall s':>9}  {'each seed s':<26}{'model-epochs':>13}{'best acc':>10}"
          f"{f'top-{TOP} acc':>11}")
    for name, row in report["rows"].items():
        walls = ", ".join(f"{w:.1f}" for w in row["walls_s"])
        print(f"{name:<13}{row['wall_s']:>9.1f}  {walls:<26}{row['model_epochs']:>13.1f}{row['best']:>10.3f}"
              f"{row['top']:>11.3f}")
    for line in verdicts(report):
        print(line)


def verdicts(report: dict) -> list[str]:
    """Issue 44's targets, each against what ran."""
    rows, ratio, lines = report["rows"], report["ratios"], []
    for method in ("asha", "sha"):
        key = f"epochs_fleet_over_{method}"
        if key in ratio:
            drop = rows["fleet"]["best"] - rows[f"fleet-{method}"]["best"]
            lines.append(f"model-epochs fleet / fleet-{method}: {ratio[key]:.2f}x (target >= {TARGETS[method]}x); best "
                         f"accuracy {100 * drop:+.2f} points below the full sweep's (target <= 1): "
                         f"{met(ratio[key] >= TARGETS[method] and within_a_point(drop))}")
    if "wall_ray_over_fleet_asha" in ratio:
        drop = rows["ray-asha"]["best"] - rows["fleet-asha"]["best"]
        lines.append(f"wall ray-asha / fleet-asha: {ratio['wall_ray_over_fleet_asha']:.2f}x (target >= "
                     f"{TARGETS['ray']}x); fleet-asha's best accuracy {100 * drop:+.2f} points below Ray's (target "
                     f"<= 1): {met(ratio['wall_ray_over_fleet_asha'] >= TARGETS['ray'] and within_a_point(drop))}")
    return lines


def within_a_point(drop: float) -> bool:
    """An accuracy `drop` of at most one point (exactly one point included, float rounding aside)."""
    return round(drop, 9) <= POINT


def met(ok: bool) -> str:
    return "met" if ok else "not met"


# ----------------------------------------------------------------------------- main


def contender_list(text: str) -> list[str]:
    """`--contenders`: comma-separated names from `CONTENDERS`, or none."""
    return [] if text.strip() == "none" else name_list(CONTENDERS, "contender")(text)


def comma_list(kind):
    def parse(text: str) -> list:
        return [kind(item.strip()) for item in text.split(",") if item.strip()]

    return parse


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", type=int, default=4, choices=range(1, 5), metavar="K",
                        help="each of the 8 architectures at K learning rates (1-4; default 4: 32 configurations)")
    parser.add_argument("--epochs", type=at_least(2), default=8, help="max_epochs of every model (max_t)")
    parser.add_argument("--min-epochs", type=at_least(1), default=1, help="the first rung (grace period, min_resource)")
    parser.add_argument("--reduction", type=at_least(2), default=2,
                        help="eta, the reduction factor (an integer, as Optuna's)")
    parser.add_argument("--seeds", type=at_least(1), default=3, help="sweeps, with the spec's seed 11, 12, ...")
    parser.add_argument("--first-seed", type=at_least(0), default=0,
                        help="skip this many seeds (3: the sweeps of seeds 14, 15, ...; more seeds for the same means)")
    add_setting_arguments(parser)  # --samples, --slots (also Ray's trials and Optuna's workers), --threads, ...
    parser.add_argument("--contenders", type=contender_list, default=list(CONTENDERS),
                        help=f"comma-separated, from {','.join(CONTENDERS)} (default: all), or none")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds one command may take")
    parser.add_argument("--simulate", action="store_true", help="also the simulator on paper100 (first)")
    parser.add_argument("--sim-gpus", type=comma_list(int), default=[40, 160], help="--simulate: GPU counts")
    parser.add_argument("--sim-policies", type=comma_list(str), default=["fleet-g", "fleet-adaptive"],
                        help="--simulate: the policies")
    parser.add_argument("--sim-noise", type=float, default=0.3, help="--simulate: epoch estimates x U(1-x, 1+x)")
    parser.add_argument("--keep", metavar="DIR", help="keep the data and every run directory in DIR")
    parser.add_argument("--json", metavar="FILE", help="write every figure to FILE")
    args = parser.parse_args()
    if args.min_epochs >= args.epochs:
        parser.error(f"--min-epochs {args.min_epochs} must be below --epochs {args.epochs}")
    return args


def run_seeds(root: Path, contenders: list[str], args) -> list[dict[str, Sweep]]:
    """Every seed's sweep by every contender, alternating; a line per run as it ends."""
    data, runs = make_data(root, args), []
    for offset in range(args.first_seed, args.first_seed + args.seeds):
        spec_path, one = seed_spec(root, data, args, offset), {}
        for name in contenders:
            one[name] = RUNNERS[name](name, spec_path, fresh_dir(root / f"seed{offset}" / name), args)
            print(f"seed {offset}: {name} {one[name].wall_s:.1f} s, {one[name].model_epochs} model-epochs, best "
                  f"{one[name].best:.3f}, top-{TOP} {one[name].top:.3f}", flush=True)
        runs.append(one)
    return runs


def main() -> None:
    args = parse_args()
    record: dict = {"settings": vars(args)}
    if args.simulate:
        record["simulated"] = simulate(args)
        print_simulated(record["simulated"], args)
    contenders = [name for name in args.contenders if name not in PEER_MODULES or not peer_missing(*PEER_MODULES[name])]
    if contenders:
        with work_dir(args.keep) as root:
            runs = run_seeds(root, contenders, args)
        record["summary"] = summary(runs, contenders)
        record["runs"] = [{name: sweep.record() for name, sweep in one.items()} for one in runs]
        print_table(record["summary"], args, args.seeds, len(runs[0][contenders[0]].epochs))
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
