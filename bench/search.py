"""Adaptive search against random search (issue 48), the run's greedy ensemble against its best
single model, and the same TPE search run by Optuna alone and by Ray Tune.

One CNN family with 4 searched parameters (learning rate, weight decay, width, depth) on the
synthetic JPEG set (with a held-out test split), a budget of `--budget` models (48), for each
of `--seeds` seeds (3), with and without ASHA early stopping (`min_epochs` 1, reduction 3).
Width and depth are one categorical dimension (`ARCHITECTURES`, the CNN's `channels`), which
random search crosses as a grid, so random's ``samples: budget / 6`` and tpe's ``budget`` make
the same number of models over the same space. The contenders (`--contenders`), alternating
within each seed and early-stopping setting so that drift in the machine's load falls on all:

- random: `fleet run` with ``sampler: random`` (the budget drawn when the spec is read);
- tpe: `fleet run` with ``sampler: tpe`` (asked while the run trains, Optuna's TPE with the
  constant liar), ASHA through ``scheduler.early_stop``;
- optuna-tpe: Optuna alone, as its users run it: `--slots` worker processes sharing one
  journal file, each opening the data once and then looping ask -> train (the plain PyTorch
  loop of `bench/plain_loop.py`) -> tell for its share of the budget, TPE with the constant
  liar, ASHA as Optuna's `SuccessiveHalvingPruner` (asynchronous: a trial is pruned at a rung
  as soon as it falls out of the top 1/eta reported there); fleet's mapping of the space to
  Optuna's distributions;
- ray-tpe: Ray Tune with Optuna's TPE as its searcher (`OptunaSearch`, at most `--slots`
  trials at once) and `ASHAScheduler`, a trial training its model with the same plain loop.

The peers train on fleet's training split and score on its validation and test splits. Per
(contender, early stopping), means over the seeds: the best validation accuracy of the run and
the test accuracy of that model (its best epoch's), the wall time (launch to exit); for fleet's
runs also the greedy ensemble (`fleet ensemble --size K`) against the best single model on
test: accuracy, NLL, ECE. The peers keep no predictions, so they have no ensemble.

Targets (issue 48): tpe's best validation accuracy within 0.5 points of random's or better
(mean over the seeds); the ensemble's test NLL below the best single model's. The peers' rows
say where fleet's tpe stands against the same sampler outside fleet (accuracy and wall time).

The peers are this bench's only (not in the project's requirements); install them with
    .venv/bin/pip install 'ray[tune]==2.60.0' 'optuna==5.0.0'
A peer that is not installed is skipped with a note.

Usage:
    python bench/search.py [--budget 48] [--seeds 3] [--samples 3000] [--epochs 6] [--slots 4]
                           [--contenders random,tpe,optuna-tpe,ray-tpe] [--work DIR]
    python bench/search.py --budget 6 --seeds 1 --samples 300 --image-size 16 --epochs 2 --slots 2   # a tiny check
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import zlib
from pathlib import Path

import yaml

from _harness import at_least, fleet, fleet_run, jpeg_folder, name_list, work_dir
from peers import peer_missing, run_driver, tune_fit

SAMPLERS = ("random", "tpe")
"""fleet's contenders: the spec's sampler."""
PEERS = ("optuna-tpe", "ray-tpe")
CONTENDERS = (*SAMPLERS, *PEERS)
PEER_MODULES = {"optuna-tpe": ("optuna", "'optuna==5.0.0'"), "ray-tpe": ("ray", "'ray[tune]==2.60.0'")}
EARLY_STOPS = ("none", "asha")
ASHA = {"min_epochs": 1, "reduction": 3}
ARCHITECTURES = [[w * 2 ** k for k in range(depth)] for depth in (1, 2, 3) for w in (8, 16)]
"""Width x depth as the CNN's `channels` (a width doubling at each of `depth` layers): one
categorical dimension, which random search crosses as a grid (`samples` = budget / 6 each)."""
SPACE = {"train.lr": {"loguniform": [0.003, 0.3]}, "train.weight_decay": {"loguniform": [1e-6, 1e-2]},
         "channels": {"choice": ARCHITECTURES}}
FLEET_TIMEOUT_S = 7200
OPTUNA_DRIVER = "import search; search.optuna_driver()"  # the Optuna contender's process (`python -c`)
RAY_DRIVER = "import search; search.ray_driver()"  # the Ray Tune contender's process
STUDY = "search"  # the peers' study name


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
        "scheduler": {"policy": "auto", **({"early_stop": {"method": "asha", **ASHA}} if early == "asha" else {})},
        "cluster": {"nodes": 1, "gpus_per_node": args.slots, "preprocessors_per_node": 1, "device": "cpu",
                    "threads_per_trainer": 1},
    }


def write_spec(args: argparse.Namespace, folder: Path, data: Path, sampler: str, early: str, seed: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    spec = folder / "spec.yaml"
    spec.write_text(yaml.safe_dump(spec_doc(args, data, sampler, early, seed), sort_keys=False))
    return spec


def one_run(args: argparse.Namespace, work: Path, data: Path, contender: str, early: str, seed: int) -> dict:
    """Train one contender's search; the figures of its row (a peer's have no ensemble)."""
    folder = work / f"{contender}-{early}-{seed}"
    if contender in PEERS:  # the peers read tpe's spec: its data, space, budget, epochs and seed
        spec = write_spec(args, folder, data, "tpe", early, seed)
        return peer_run(args, folder, spec, contender, early)
    spec = write_spec(args, folder, data, contender, early, seed)
    run = fleet_run(spec, folder / "run", FLEET_TIMEOUT_S, what=f"{contender} {early} seed {seed}")
    models = run.results["models"]
    best = max(models, key=lambda m: m.get("best_val_accuracy") or 0.0)
    fleet("ensemble", str(folder / "run"), "--size", str(args.ensemble), timeout=600)
    chosen = json.loads((folder / "run" / "ensemble.json").read_text())
    return {"val": best["best_val_accuracy"], "test_of_best": chosen["best_single"]["accuracy"],
            "models": len(models), "wall_s": run.wall_s, "ensemble": chosen["ensemble"],
            "single": chosen["best_single"], "evaluated_on": chosen["evaluated_on"]}


def peer_run(args: argparse.Namespace, folder: Path, spec: Path, peer: str, early: str) -> dict:
    """A peer's search in a process of its own (its start-up counts, as fleet's does)."""
    out = folder / "peer.json"
    code, what = (OPTUNA_DRIVER, "Optuna (TPE)") if peer == "optuna-tpe" else (RAY_DRIVER, "Ray Tune (Optuna's TPE)")
    arguments = [spec, args.slots, early, folder / "peer", out]
    wall = run_driver(code, arguments, f"{what}, early stop {early}", FLEET_TIMEOUT_S)
    models = json.loads(out.read_text())["models"]
    best = max(models, key=lambda m: m["best_val_accuracy"])
    return {"val": best["best_val_accuracy"], "test_of_best": best["test_accuracy_of_best"], "models": len(models),
            "wall_s": wall, "ensemble": None, "single": None, "evaluated_on": "test"}


# ----------------------------------------------------------------------------- the peers' processes


def peer_search(spec_path: str):
    """The tpe spec's placeholders and searched space, as the peers ask them."""
    from fleet.spec import load_spec  # fleet kept out of this module's imports for the bench's own process

    spec = load_spec(spec_path)
    return spec, spec.models[0].search.space


def asked(spec, number: int, values: dict):
    """The peer's `number`-th model: fleet's placeholder of that number with the asked values (its
    id and seed, as fleet's `number`-th ask would train)."""
    from fleet.spec.load import asked_model  # as peer_search

    return asked_model(spec.models[number], values)


class BestEpoch:
    """An epoch hook (`plain_loop.EpochHook`) that keeps the best validation accuracy so far and
    its epoch's test accuracy, and asks `go_on(record)` whether to train on."""

    def __init__(self, go_on=lambda record: True):
        self.go_on, self.best, self.test, self.epochs = go_on, -1.0, None, 0

    def __call__(self, record: dict) -> bool:
        self.epochs = record["epoch"]
        if record["val_accuracy"] > self.best:
            self.best, self.test = record["val_accuracy"], record.get("test_accuracy")
        return self.go_on(record)

    def result(self) -> dict:
        return {"epochs": self.epochs, "best_val_accuracy": self.best, "test_accuracy_of_best": self.test}


def optuna_driver() -> None:
    """`python -c OPTUNA_DRIVER SPEC SLOTS EARLY FOLDER OUT`: a TPE study in FOLDER's journal,
    SLOTS spawned workers (`optuna_worker`, the data opened once each) sharing the budget; OUT
    gets each trial's result."""
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    from plain_loop import worker_init  # imports torch

    spec_path, slots, early, folder, out = sys.argv[1:]
    slots, budget = int(slots), peer_search(spec_path)[0].models[0].search.budget
    Path(folder).mkdir(parents=True, exist_ok=True)
    journal = str(Path(folder) / "journal.log")
    shares = [budget // slots + (k < budget % slots) for k in range(slots)]
    with ProcessPoolExecutor(slots, mp_context=get_context("spawn"), initializer=worker_init,
                             initargs=(spec_path, 1)) as pool:
        done = list(pool.map(optuna_worker, [journal] * slots, range(slots), shares, [early] * slots))
    Path(out).write_text(json.dumps({"models": [m for share in done for m in share]}))


def optuna_worker(journal: str, worker: int, trials: int, early: str) -> list[dict]:
    """One worker (`plain_loop.worker_init` opened its data): `trials` times ask a model of the
    study, train it with the plain loop (reporting each epoch's validation accuracy to the
    pruner with ASHA) and tell its best validation accuracy, or that it was pruned."""
    import optuna  # optional heavy dependency, this bench's only
    from optuna.trial import TrialState

    from early_stop import Pruning, halving_pruner, journal_storage
    from fleet.runtime.control.study import distributions, values_of  # fleet's mapping of the space
    from plain_loop import worker_spec, worker_train_model  # imports torch

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    spec = worker_spec()
    space = spec.models[0].search.space
    pruner = halving_pruner(ASHA["min_epochs"], ASHA["reduction"]) if early == "asha" else optuna.pruners.NopPruner()
    sampler = optuna.samplers.TPESampler(seed=spec.seed * 1000 + worker, constant_liar=True)
    study = optuna.create_study(study_name=STUDY, storage=journal_storage(journal), direction="maximize",
                                sampler=sampler, pruner=pruner, load_if_exists=True)
    trained = []
    for _ in range(trials):
        trial = study.ask(fixed_distributions=distributions(space))
        model = asked(spec, trial.number, values_of(space, trial.params))
        pruning = Pruning(trial)
        hook = BestEpoch(pruning)
        worker_train_model(model, model.seed, on_epoch=hook)
        if pruning.pruned:
            study.tell(trial, state=TrialState.PRUNED)
        else:
            study.tell(trial, hook.best)
        trained.append({"number": trial.number, "pruned": pruning.pruned, **hook.result()})
    return trained


def tune_space(space: dict) -> dict:
    """The searched dimensions as Ray Tune's sampling functions (a choice of lists by JSON text)."""
    from ray import tune  # optional heavy dependency, this bench's only

    out = {}
    for key, dim in space.items():
        if dim.choice is not None:
            out[key] = tune.choice([json.dumps(c) for c in dim.choice])
        elif dim.loguniform is not None:
            out[key] = tune.loguniform(*dim.loguniform)
        elif dim.uniform is not None:
            out[key] = tune.uniform(*dim.uniform)
        else:
            out[key] = tune.randint(dim.int_range[0], dim.int_range[1] + 1)
    return out


def tpe_trial(config: dict) -> None:
    """A Ray Tune trial: the model of the asked values (`config`), trained by the plain loop,
    reporting each epoch's validation accuracy (ASHA decides on it) and the best so far."""
    from plain_loop import train_model, PlainData  # imports torch, which only the trials need
    from ray import tune  # optional heavy dependency, this bench's only
    import torch

    torch.set_num_threads(1)
    spec, space = peer_search(config["spec"])
    trial = tune.get_context().get_trial_id()  # a searcher's trials have no number: a seed of its id
    values = {key: json.loads(config[key]) if space[key].choice is not None else config[key] for key in space}
    model = asked(spec, 0, values).model_copy(update={"id": f"cnn-{trial}", "seed": zlib.crc32(trial.encode())})

    def report(record: dict) -> bool:
        tune.report({"index": trial, "val_accuracy": record["val_accuracy"], **hook.result()})
        return True  # ASHA stops the trial itself

    hook = BestEpoch(report)
    train_model(model, PlainData.open(spec), model.seed, on_epoch=hook)


def ray_driver() -> None:
    """`python -c RAY_DRIVER SPEC SLOTS EARLY FOLDER OUT`: Ray Tune over the tpe spec's space,
    Optuna's TPE asking `budget` trials, at most SLOTS at once on one CPU each, ASHA where asked;
    OUT gets each trial's last report and Ray's own seconds."""
    from ray.tune.schedulers import ASHAScheduler  # optional heavy dependency, this bench's only
    from ray.tune.search.optuna import OptunaSearch

    spec_path, slots, early, folder, out = sys.argv[1:]
    spec, space = peer_search(spec_path)
    tpe = OptunaSearch(metric="val_accuracy", mode="max", seed=spec.seed)
    asha = ASHAScheduler(metric="val_accuracy", mode="max", max_t=spec.models[0].train.max_epochs,
                         grace_period=ASHA["min_epochs"], reduction_factor=ASHA["reduction"]) if early == "asha" else None
    config = {**tune_space(space), "spec": spec_path}
    fitted = tune_fit(tpe_trial, config, str(Path(folder).resolve()), STUDY, slots=int(slots), cpus=int(slots),
                      trial_cpus=1, scheduler=asha, search_alg=tpe, num_samples=len(spec.models))
    Path(out).write_text(json.dumps(fitted))


# ----------------------------------------------------------------------------- the report


def table(rows: dict[tuple[str, str], list[dict]]) -> str:
    lines = ["| contender | early stop | models | best val acc | its test acc | ensemble test acc / NLL / ECE "
             "| best single test acc / NLL / ECE | wall s |", "|---|---|---:|---:|---:|---|---|---:|"]
    for (contender, early), runs in rows.items():
        def mean(get) -> float:
            return statistics.mean(get(r) for r in runs)

        def scores(part: str) -> str:
            if runs[0][part] is None:
                return "-"
            return "/".join(f"{mean(lambda r, k=k: r[part][k]):.3f}" for k in ("accuracy", "nll", "ece"))

        lines.append(f"| {contender} | {early} | {mean(lambda r: r['models']):.0f} | {100 * mean(lambda r: r['val']):.2f} "
                     f"| {100 * mean(lambda r: r['test_of_best']):.2f} | {scores('ensemble')} | {scores('single')} "
                     f"| {mean(lambda r: r['wall_s']):.0f} |")
    return "\n".join(lines)


def verdict(rows: dict[tuple[str, str], list[dict]]) -> list[str]:
    """Issue 48's targets where both of fleet's samplers ran; fleet's tpe against the peers."""
    out = []
    for early in EARLY_STOPS:
        if ("random", early) not in rows or ("tpe", early) not in rows:
            continue
        random_best = statistics.mean(r["val"] for r in rows[("random", early)])
        tpe_best = statistics.mean(r["val"] for r in rows[("tpe", early)])
        out.append(f"early stop {early}: tpe - random best val accuracy = {100 * (tpe_best - random_best):+.2f} points "
                   f"(target >= -0.5): {'met' if tpe_best - random_best >= -0.005 else 'NOT met'}")
        for peer in (p for p in PEERS if (p, early) in rows):
            wall = statistics.mean(r["wall_s"] for r in rows[(peer, early)])
            ours = statistics.mean(r["wall_s"] for r in rows[("tpe", early)])
            val = statistics.mean(r["val"] for r in rows[(peer, early)])
            out.append(f"early stop {early}: fleet tpe against {peer}: best val accuracy "
                       f"{100 * (tpe_best - val):+.2f} points, wall {peer} / fleet {wall / ours:.2f}x")
    gains = [r["single"]["nll"] - r["ensemble"]["nll"] for runs in rows.values() for r in runs if r["ensemble"]]
    if gains:
        out.append(f"ensemble NLL below the best single model's by {statistics.mean(gains):.4f} nats on average "
                   f"({sum(g > 0 for g in gains)} of {len(gains)} runs): {'met' if min(gains) > 0 else 'NOT met'}")
    return out


def runnable(contenders: list[str]) -> list[str]:
    """`contenders` less the peers that are not installed (each said in a note)."""
    return [c for c in contenders if c not in PEER_MODULES or not peer_missing(*PEER_MODULES[c])]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget", type=at_least(len(ARCHITECTURES)), default=48, help="a multiple of 6")
    parser.add_argument("--seeds", type=at_least(1), default=3)
    parser.add_argument("--samples", type=at_least(100), default=3000, help="synthetic JPEGs (10 classes)")
    parser.add_argument("--image-size", type=at_least(8), default=32)
    parser.add_argument("--epochs", type=at_least(1), default=6)
    parser.add_argument("--slots", type=at_least(1), default=4, help="CPU trainer slots (the peers' workers)")
    parser.add_argument("--ensemble", type=at_least(1), default=10, help="fleet ensemble --size")
    parser.add_argument("--contenders", type=name_list(CONTENDERS, "contender"), default=list(CONTENDERS),
                        help=f"comma-separated, from {', '.join(CONTENDERS)} (default: all)")
    parser.add_argument("--work", help="working directory (kept; default: a temporary one)")
    args = parser.parse_args()
    if args.budget % len(ARCHITECTURES):
        parser.error(f"--budget: a multiple of {len(ARCHITECTURES)} (random search crosses the architectures)")
    contenders = runnable(args.contenders)
    with work_dir(args.work) as work:
        data = jpeg_folder(work / "jpeg", args.samples, args.image_size)
        rows: dict[tuple[str, str], list[dict]] = {(c, e): [] for e in EARLY_STOPS for c in contenders}
        for seed in range(11, 11 + args.seeds):
            for early in EARLY_STOPS:
                for contender in contenders:  # alternating within a seed: drift in the load falls on all
                    started = time.perf_counter()
                    rows[(contender, early)].append(one_run(args, work, data, contender, early, seed))
                    print(f"seed {seed}, early stop {early}: {contender} done in {time.perf_counter() - started:.0f} s",
                          file=sys.stderr, flush=True)
        evaluated = {r["evaluated_on"] for runs in rows.values() for r in runs}
        print(f"budget {args.budget}, {args.seeds} seed(s), {args.samples} JPEGs of {args.image_size} px, "
              f"{args.epochs} epochs at most, {args.slots} CPU slots ({os.cpu_count()} cores); scored on "
              f"{', '.join(sorted(evaluated))}")
        print(table(rows))
        print("\n".join(verdict(rows)))


if __name__ == "__main__":
    main()
