"""End to end on the CPU: FLEET-G, fleet-adaptive, Baseline and Homogeneous on the same ranks, one invocation.

An ensemble of 8 heterogeneous CNNs (plain CNNs, ResNets and a DenseNet of different sizes)
trains on a synthetic JPEG image folder, every model for exactly `--epochs` epochs (the stop
rule is switched off), so each policy does the same training work. Each policy runs as its
own `fleet run` on the same ranks (`--preprocessors` + `--trainers` trainer slots); the bench
prints makespan, the speedup of each policy over Baseline, and the samples each decoded.

All policies plan with the same measured rates: `fleet profile` runs once first (its time is
printed) and its profile.json is copied into every policy's run directory, which `fleet run`
then reuses. On a CPU all trainer slots share the same cores, so the gain of sharing one
decoded stream shows up as less decoding work; the GPU-side gains of rate-matched flotillas
cannot.

`--sweep K`: each architecture at K learning rates (8K models), the hyper-parameter sweep
fleet is for: models of one architecture train at the same rate, so flotillas fill up.

`--emulated`: the same, but each policy's trainer slots are `device: emulated`: a training
step sleeps for the time the profile (measured on the CPU slots first) gives for its model
and group size, while the data path stays real (JPEG decoding, broadcasts, queues). The slots
then no longer share the cores, as GPUs do not, so the run shows what the runtime makes of a
plan when trainers are independent; the models learn nothing (no accuracy is shown). Beside
each measured makespan the bench prints the simulator's prediction for the same rates.

The JPEGs on disk are larger than what the models train on (96x96 resized to 24x24 by
default), as with Caltech256's photos resized for the paper's nets: decoding is real work, the
work that sharing a stream saves.

`--keep DIR` keeps the data and every run directory. Given a DIR that an earlier invocation
with the same settings left (its settings.json), the bench goes on from there: the data, the
profile and each policy that finished are reused, and a policy that did not finish runs again.
A long bench (`--sweep 4` on a machine whose commands are cut off after 10 minutes) then
finishes over several invocations; `--policies` runs a subset (Baseline always: every ratio is
to it).

Usage: .venv/bin/python bench/e2e_cpu.py [--trainers 4] [--epochs 2] [--samples 3000]
       [--source-size 96] [--image-size 24] [--preprocessors 1] [--threads 1] [--timeout 3600]
       [--wait-timeout 600] [--keep DIR] [--sweep K] [--emulated] [--policies fleet-g,baseline]
       [--collectives horovod,mpi,torch]

`--collectives`: every policy but Baseline runs once per gradient collective (``runtime.
collective``), each planning with a profile measured under that collective, so the makespans
of groups of 2 or more slots under each backend stand side by side ("in groups" counts the
models that trained on 2 or more slots).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import yaml

from _harness import at_least, fleet, fleet_run, jpeg_folder, read_results, runtime_option, work_dir

POLICIES = ("fleet-g", "fleet-adaptive", "baseline", "homogeneous")

MODELS = [
    {"family": "cnn", "name": "cnn-8", "params": {"channels": [8], "hidden": 0}},
    {"family": "cnn", "name": "cnn-8-16", "params": {"channels": [8, 16], "hidden": 32}},
    {"family": "cnn", "name": "cnn-16-32", "params": {"channels": [16, 32], "hidden": 64}},
    {"family": "cnn", "name": "cnn-32-64", "params": {"channels": [32, 64], "hidden": 128}},
    {"family": "cnn", "name": "cnn-8-16-32", "params": {"channels": [8, 16, 32], "hidden": 0}},
    {"family": "resnet", "name": "resnet-w4", "params": {"blocks": [1, 1, 1, 1], "width": 4}},
    {"family": "resnet", "name": "resnet-w8", "params": {"blocks": [1, 1, 1, 1], "width": 8}},
    {"family": "densenet", "name": "densenet-g4", "params": {"blocks": [2, 2], "growth_rate": 4}},
]


SWEEP_LR = (0.05, 0.025, 0.1, 0.0125)  # --sweep K trains each architecture at the first K


def models_for(sweep: int) -> list[dict]:
    """The 8 architectures; with `sweep` > 1, each at `sweep` learning rates (a hyper-parameter
    sweep: models of one architecture train at the same rate)."""
    if sweep <= 1:
        return MODELS
    return [{**model, "name": f"{model['name']}-lr{k}", "train": {"lr": SWEEP_LR[k]}}
            for model in MODELS for k in range(sweep)]


def spec_for(policy: str, data: Path, args, device: str = "cpu", collective: str | None = None) -> dict:
    runtime = {"timeout_s": args.wait_timeout, **dict(runtime_option(text) for text in args.runtime)}
    if collective:
        runtime["collective"] = collective
    return {
        "name": f"e2e-{policy}", "seed": 11,
        "data": {"source": "imagefolder", "path": str(data), "image_size": args.image_size, "channels": 3,
                 "val_fraction": 0.1},
        "preprocess": ["decode", {"resize": {"size": args.image_size + 2}}, {"random_crop": {"size": args.image_size}},
                       {"flip": {"p": 0.5}},
                       {"normalize": {"mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25]}}],
        "models": models_for(args.sweep),
        "train": {"batch_size": 32, "max_epochs": args.epochs, "optimizer": "sgd", "lr": 0.05,
                  "stop": {"patience": 1000}},
        "scheduler": {"policy": policy},
        "runtime": runtime,
        "cluster": {"nodes": 1, "gpus_per_node": args.trainers, "preprocessors_per_node": args.preprocessors,
                    "threads_per_trainer": args.threads, "device": device},
    }


def profile_once(data: Path, root: Path, args, collective: str | None = None) -> tuple[Path, float]:
    """`fleet profile` on the fleet-g spec; the profile.json path and the profiler's seconds."""
    name = f"profile-{collective}" if collective else "profile"
    spec_path = root / f"{name}.yaml"
    spec_path.write_text(yaml.safe_dump(spec_for("fleet-g", data, args, collective=collective)))
    run_dir = root / name
    shutil.rmtree(run_dir, ignore_errors=True)  # what an invocation cut off left
    fleet("profile", str(spec_path), "--run-dir", str(run_dir), "--quiet", timeout=3600, what="profiling")
    path = run_dir / "profile.json"
    return path, json.loads(path.read_text())["profiler"]["seconds"]


def kept_or_new_profile(data: Path, root: Path, args, going_on: bool, collective: str | None) -> tuple[Path, float]:
    """The profile (and its seconds) that the runs with `collective` plan with: an earlier
    invocation's when it fits, else a new one (the rates on m slots depend on the collective)."""
    profile = root / (f"profile-{collective}" if collective else "profile") / "profile.json"
    name = f" with collective {collective}" if collective else ""
    if going_on and profile_fits(profile, data, args, collective):
        profile_s = json.loads(profile.read_text())["profiler"]["seconds"]
        print(f"profile{name} kept from an earlier invocation (profiled in {profile_s:.1f} s)", flush=True)
        return profile, profile_s
    profile, profile_s = profile_once(data, root, args, collective)
    print(f"profiled once{name} in {profile_s:.1f} s", flush=True)
    return profile, profile_s


def runs_of(args) -> list[tuple[str, str | None]]:
    """(policy, collective) of every run: with `--collectives`, each policy but Baseline (whose
    models train on one slot each, with no collective) once per collective."""
    return [(policy, collective) for policy in args.policies
            for collective in (args.collectives if args.collectives and policy != "baseline" else [None])]


def models_in_groups(run_dir: Path) -> int:
    """How many models trained on 2 or more trainer slots at some time (events.jsonl)."""
    lines = (run_dir / "events.jsonl").read_text().splitlines()
    starts = (json.loads(line) for line in lines if '"member_start"' in line)
    return len({event["model"] for event in starts if len(event["gpus"]) >= 2})


def profile_fits(profile: Path, data: Path, args, collective: str | None = None) -> bool:
    """Whether a kept profile is one `fleet run` reuses for these specs (else every policy's run
    would profile again on its own): it exists and its fingerprint matches."""
    # fleet is imported where it is used: peers.py's driver processes import this module (for
    # its models and spec), and their start-up is part of what that bench measures
    from fleet.profiling.document import reuse_verdict
    from fleet.spec import parse_spec

    if not profile.exists():
        return False
    spec = parse_spec(spec_for("fleet-g", data, args, collective=collective))
    fits, why = reuse_verdict(json.loads(profile.read_text()), spec)
    if not fits:
        print(f"kept profile not reused ({why}): profiling again", flush=True)
    return fits


def predictions(profile: Path, data: Path, args, collective: str | None = None) -> dict[str, float]:
    """The simulator's makespan of each policy at the profiled rates (and decode limit)."""
    from fleet.schedule_io import load_profile  # fleet kept out of the module's imports (see profile_fits)
    from fleet.spec import parse_spec
    from fleet.prediction import predicted_makespans

    spec = parse_spec(spec_for("fleet-g", data, args, collective=collective))
    return predicted_makespans(spec, load_profile(profile), POLICIES)


SETTINGS = ("trainers", "epochs", "samples", "source_size", "image_size", "preprocessors", "threads", "runtime",
            "sweep", "emulated", "collectives")  # what a kept directory's results depend on


def open_kept(root: Path, args) -> bool:
    """Check that `root` is empty (then record the settings) or holds a run of these settings;
    True when it holds one to go on from."""
    settings = {name: getattr(args, name) for name in SETTINGS}
    record = root / "settings.json"
    if record.exists():
        kept = json.loads(record.read_text())
        differ = [f"{name} {kept.get(name)!r} there, {value!r} now" for name, value in settings.items()
                  if kept.get(name) != value]
        if differ:
            sys.exit(f"--keep {root}: made with other settings ({'; '.join(differ)})")
        return True
    if any(root.iterdir()):
        sys.exit(f"--keep {root}: not empty and not a directory of this bench (no settings.json)")
    record.write_text(json.dumps(settings, indent=1))
    return False


def kept_results(run_dir: Path) -> dict | None:
    """A policy's results from an earlier invocation, if that run finished."""
    if not (run_dir / "results.json").exists():
        return None
    result = read_results(run_dir)
    return None if result.get("interrupted") else result


def run_policy(label: str, data: Path, root: Path, args, profile: Path) -> dict:
    policy, _, collective = label.partition("/")
    spec_path = root / f"{label.replace('/', '-')}.yaml"
    device = "emulated" if args.emulated else "cpu"
    spec_path.write_text(yaml.safe_dump(spec_for(policy, data, args, device, collective or None)))
    run_dir = root / label.replace("/", "-")
    shutil.rmtree(run_dir, ignore_errors=True)  # what an invocation cut off left
    run_dir.mkdir()
    shutil.copy(profile, run_dir / "profile.json")
    return fleet_run(spec_path, run_dir, args.timeout, what=policy).results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trainers", type=at_least(1), default=4)
    parser.add_argument("--epochs", type=at_least(1), default=2)
    parser.add_argument("--samples", type=at_least(1), default=3000)
    parser.add_argument("--source-size", type=at_least(1), default=96, help="side of the JPEGs on disk")
    parser.add_argument("--image-size", type=at_least(1), default=24, help="side the models train on")
    parser.add_argument("--preprocessors", type=at_least(1), default=1, help="preprocessor ranks")
    parser.add_argument("--threads", type=at_least(1), default=1, help="torch threads per trainer slot")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds one policy's run may take")
    parser.add_argument("--wait-timeout", type=float, default=600,
                        help="the runtime's timeout_s: how long any rank waits before it aborts the job")
    parser.add_argument("--runtime", action="append", default=[], metavar="KEY=VALUE",
                        help="a runtime option of every run's spec, e.g. shared_memory=false (repeatable)")
    parser.add_argument("--keep", metavar="DIR", help="keep the data and every run directory in DIR (new or empty)")
    parser.add_argument("--sweep", type=int, default=1, choices=range(1, len(SWEEP_LR) + 1), metavar="K",
                        help=f"train each architecture at K learning rates (1-{len(SWEEP_LR)}; default 1: 8 models)")
    parser.add_argument("--emulated", action="store_true",
                        help="trainer slots sleep the profiled step time instead of training (the data path stays real)")
    parser.add_argument("--collectives", default=[], type=collective_list,
                        help="comma-separated runtime.collective values (mpi,torch,horovod): every policy but baseline "
                             "runs once with each, with a profile of its own (default: the spec's auto, once)")
    parser.add_argument("--policies", default=",".join(POLICIES), type=policy_list,
                        help=f"comma-separated, from {','.join(POLICIES)} (baseline is always run; default: all)")
    args = parser.parse_args()
    with work_dir(args.keep) as root:
        going_on = open_kept(root, args)
        data = jpeg_folder(root / "images", args.samples, args.source_size)
        profiles = {collective: kept_or_new_profile(data, root, args, going_on, collective)
                    for collective in (None, *args.collectives)}
        profile_s = profiles[None][1]
        predicted = {collective: predictions(path, data, args, collective) for collective, (path, _) in profiles.items()}
        results = {}
        for policy, collective in runs_of(args):
            label = f"{policy}/{collective}" if collective else policy
            kept = kept_results(root / label.replace("/", "-")) if going_on else None
            results[label] = kept or run_policy(label, data, root, args, profiles[collective][0])
            results[label]["predicted_s"] = predicted[collective][policy]
            res = results[label]
            print(f"{label}: makespan {res['makespan_s']:.1f} s, {res['rounds']} round(s), "
                  f"{res['samples_decoded']:,} decoded{' (kept from an earlier invocation)' if kept else ''}",
                  flush=True)
            res["in_groups"] = models_in_groups(root / label.replace("/", "-"))
    base = results["baseline"]
    slots = "emulated trainer slots (steps sleep the profiled time)" if args.emulated else (
        f"CPU trainer slots of {args.threads} thread(s)")
    print(f"{len(models_for(args.sweep))} CNNs x {args.epochs} epochs on {args.samples} JPEGs ({args.source_size}x{args.source_size} "
          f"on disk, {args.image_size}x{args.image_size} after resize and crop), "
          f"{args.preprocessors} preprocessor(s) + {args.trainers} {slots}; profiled once in {profile_s:.1f} s")
    print(f"{'policy':<22}{'makespan s':>11}{'vs baseline':>13}{'predicted s':>12}{'predicted vs base':>19}"
          f"{'rounds':>8}{'decoded':>10}{'decoded/base':>14}{'mean best acc':>15}{'planning':>10}{'checkpoint':>12}"
          f"{'in groups':>11}")
    for policy, res in results.items():
        accuracy = "-" if args.emulated else f"{sum(m['best_val_accuracy'] for m in res['models']) / len(res['models']):.3f}"
        print(f"{policy:<22}{res['makespan_s']:>11.1f}{base['makespan_s'] / res['makespan_s']:>12.2f}x"
              f"{res['predicted_s']:>12.1f}{base['predicted_s'] / res['predicted_s']:>18.2f}x"
              f"{res['rounds']:>8}{res['samples_decoded']:>10,}{res['samples_decoded'] / base['samples_decoded']:>14.2f}"
              f"{accuracy:>15}{share(res, 'planning'):>10}{checkpoint_share(res):>12}{res['in_groups']:>11}")
    print("planning: the coordinator's planning seconds as a share of the makespan; checkpoint: the trainers' "
          "seconds waiting for their group's saves (results.json's checkpoint_gpu) as a share of all trainers' "
          "seconds (makespan x trainers); in groups: models that trained on 2 or more trainer slots at some time")


def policy_list(text: str) -> list[str]:
    chosen = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in chosen if name not in POLICIES]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown polic{'ies' if len(unknown) > 1 else 'y'} {', '.join(unknown)} "
                                         f"(choose from {', '.join(POLICIES)})")
    return [name for name in POLICIES if name in chosen or name == "baseline"]


def collective_list(text: str) -> list[str]:
    from fleet.runtime.train.collectives import kinds  # fleet kept out of the module's imports (see profile_fits)

    chosen = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in chosen if name not in kinds()]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown collective {', '.join(unknown)} (choose from {', '.join(kinds())})")
    return chosen


def share(result: dict, overhead: str) -> str:
    return f"{100 * result['overhead_s'][overhead] / result['makespan_s']:.3f}%"


def checkpoint_share(result: dict) -> str:
    seconds = result["overhead_s"].get("checkpoint_gpu")  # absent in results of older runs
    return "-" if seconds is None else f"{100 * seconds / (result['makespan_s'] * result['gpus']):.3f}%"


if __name__ == "__main__":
    main()
