"""`fleet run SPEC`: train a whole ensemble from one command."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from fleet.atomic import atomic_write_json, atomic_write_text
from fleet.commands._args import CALIBRATE_HELP
from fleet.commands._watch import finish, start_timeout
from fleet.report.results import leaderboard_rows, write_results
from fleet.runlock import RunLock
from fleet.runtime.control.rungs import check_recorded_setting
from fleet.runtime.control.setup import check_partitions
from fleet.runtime.events import EventLog, read_events
from fleet.runtime.launch.mpiexec import find_mpiexec, launcher_for, mpiexec_command, ranks_per_node, start_here
from fleet.runtime.launch.signals import EXIT_CHECKPOINTED
from fleet.runtime.train.collectives.factory import resolve_backend
from fleet.runtime.train.local import train_local
from fleet.schedule.calibration import predicted_wall_s
from fleet.schedule.rates import is_number
from fleet.schedule_io import load_calibration
from fleet.spec import SpecError
from preprocess.grouped import load_run_spec


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "run",
        help="train an ensemble (start here)",
        description="Train every model of an ensemble spec and write results into the run directory.",
    )
    parser.add_argument("spec", help="ensemble YAML file")
    parser.add_argument("--run-dir", help="run directory (default: the spec's run_dir, else runs/NAME)")
    parser.add_argument("--local", action="store_true", help="train the models one after another in this process")
    parser.add_argument("--device", choices=["cpu", "cuda", "emulated"], help="override cluster.device")
    parser.add_argument("--quiet", action="store_true", help="no per-epoch lines (batch logs)")
    parser.add_argument("--calibrate-from", metavar="DIR", help=CALIBRATE_HELP)
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    say = (lambda line: print(f"fleet: {line}")) if args.local else None  # else rank 0 says it
    spec = load_run_spec(args.spec, run_dir=args.run_dir, say=say)
    check_partitions(spec)
    check_recorded_setting(spec.run_dir, spec.early_stop_settings())
    RunLock(spec.run_dir, "fleet run").check_free()
    if args.calibrate_from is not None:
        load_calibration(Path(args.calibrate_from), spec.cluster.device.value, required=True)
    if args.local:
        if spec.data.group_by is not None:
            raise SpecError("data.group_by: fleet run --local trains on the whole data; models of groups need the "
                            "MPI run (leave out --local)")
        if spec.early_stop_settings().method != "none":
            raise SpecError("scheduler.early_stop: fleet run --local trains every model to its end, one after "
                            "another (the reference); early stopping needs the MPI run (leave out --local)")
        searched = next((i for i, m in enumerate(spec.models) if m.search is not None), None)
        if searched is not None:
            raise SpecError(f"{spec.entry(searched)}.sampler: {spec.models[searched].search.sampler} asks models while "
                            "GPUs free up; an adaptive search needs the MPI run (leave out --local)")
        return run_local(spec, args)
    check_collective(spec, args.device)
    ranks = spec.cluster.nodes * ranks_per_node(spec)
    command = mpiexec_command(spec, args.spec, launcher_for(find_mpiexec()), sys.executable, args.quiet, args.device,
                              args.calibrate_from)
    launched = time.time()
    code = finish(spec, start_here(command, f"starting {ranks} ranks", spec.run_dir, start_timeout(spec)), training=True)
    if code in (0, EXIT_CHECKPOINTED):  # rank 0 has printed the best models and drawn report.html
        record_time_outside_the_ranks(Path(spec.run_dir), launched, time.time())
    return code


def record_time_outside_the_ranks(run_dir: Path, launched: float, ended: float) -> None:
    """Add to results.json's ``overhead_s`` what the ranks' own clocks miss: ``launch`` (from
    `fleet run` starting mpiexec to the ranks' start-up clock: mpiexec, interpreters, imports,
    MPI_Init) and ``shutdown`` (from the last model's end to every rank's exit; rank 0 draws
    the report meanwhile, ``report`` of it), and to its ``prediction`` the wall time from
    `fleet run` starting the ranks to their exit (``measured_wall_s``) and the predicted one
    (``wall_s``: the launch and start-up as they took, known before the first step, the
    predicted makespan and the tail an earlier job of the spec took, ``tail_s``, else an
    assumed one: `fleet.schedule.calibration.predicted_wall_s`)."""
    path = run_dir / "results.json"
    events = {e["event"]: e for e in read_events(run_dir / "events.jsonl") if e["event"] in ("run_start", "run_end")}
    if not path.exists() or set(events) != {"run_start", "run_end"}:
        return
    results = json.loads(path.read_text(encoding="utf-8"))
    overhead = results.setdefault("overhead_s", {})
    overhead["launch"] = round(max(0.0, events["run_start"]["time"] - events["run_start"]["startup_s"] - launched), 3)
    overhead["shutdown"] = round(max(0.0, ended - events["run_end"]["time"]), 3)
    prediction = results.get("prediction")
    if isinstance(prediction, dict):
        prediction["measured_wall_s"] = round(ended - launched, 3)
        if is_number(prediction.get("makespan_s")):
            tail = prediction.get("tail_s")
            prediction["wall_s"] = round(predicted_wall_s(overhead["launch"], float(overhead.get("startup") or 0.0),
                                                          prediction["makespan_s"], len(results.get("models") or ()),
                                                          tail if is_number(tail) else None), 3)
    atomic_write_json(path, results)


def check_collective(spec, device: str | None) -> None:
    """Stop before any rank starts when groups of several trainers could form and the spec's
    collective cannot be used here (e.g. ``horovod`` not built); raises `UserError`. ``auto``
    always finds one, so it is left to the ranks (the check imports the framework: seconds)."""
    if spec.cluster.gpus > 1 and spec.runtime.collective != "auto":
        resolve_backend(spec.runtime.collective, device or spec.cluster.device.value)


def run_local(spec, args: argparse.Namespace) -> int:
    run_dir = Path(spec.run_dir)
    with RunLock(run_dir, "fleet run --local") as lock:
        if lock.note:
            print(f"fleet: note: {lock.note}")
        return _train_here(spec, run_dir, args)


def _train_here(spec, run_dir, args: argparse.Namespace) -> int:
    atomic_write_text(run_dir / "spec.yaml", spec.to_yaml())
    device = args.device or ("cpu" if spec.cluster.device.value == "emulated" else spec.cluster.device.value)
    log = EventLog(run_dir / "events.jsonl")
    print(f"fleet: {spec.name}: {len(spec.models)} models, one after another on {device}; run dir {run_dir}")

    def on_epoch(record) -> None:
        log.write("epoch", **record.__dict__)
        if not args.quiet:
            print(
                f"  {record.model:<16} epoch {record.epoch:>3}  loss {record.train_loss:.4f}  "
                f"val acc {record.val_accuracy:.3f}  {record.samples_per_s:,.0f} samples/s",
                flush=True,
            )

    result = train_local(spec, device, on_epoch, on_notice=lambda line: print(f"fleet: {line}", flush=True))
    write_results(run_dir, result)
    log.close()
    best = leaderboard_rows(result.models)[0]
    print(
        f"fleet: done in {result.makespan_s:.1f} s; best {best.id} val acc {best.best_val_accuracy:.3f}; "
        f"results in {run_dir / 'results.json'}",
        file=sys.stdout,
    )
    return 0
