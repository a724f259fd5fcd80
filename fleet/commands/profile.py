"""`fleet profile SPEC`: a dry run. Measure r_i(m) and preprocessing throughput, print the
plan and the predicted makespan per policy, write profile.json, plan.json and a Gantt chart.

Outside an MPI job it starts `mpiexec` itself (as `fleet run` does); under srun, jsrun or
mpiexec each rank runs the profiling phase of `fleet train` and stops before training.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from fleet.commands._args import positive_float, positive_int, positive_int_list
from fleet.commands._pilot import run_pilot
from fleet.commands._watch import finish, start_timeout
from fleet.errors import UserError
from fleet.prediction import dry_run
from fleet.rank_entry import train_entry
from fleet.runtime.control.setup import check_partitions
from fleet.runtime.launch.jobenv import read_job_env
from fleet.runtime.launch.mpiexec import find_mpiexec, launcher_for, mpiexec_command, start_here
from fleet.runtime.rank import TrainOptions
from preprocess.grouped import load_run_spec


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "profile",
        help="dry run: measure rates, print the plan and predicted makespans, train nothing",
        description="Profile every model of an ensemble (training rate on 1..M_t GPUs) and the preprocessors, "
        "then print the plan and its predicted makespan per policy. Writes profile.json, plan.json and "
        "plan-gantt.png into the run directory. Nothing is trained beyond the profiling batches.",
    )
    parser.add_argument("spec", help="ensemble YAML file")
    parser.add_argument("--run-dir", help="run directory (default: the spec's run_dir, else runs/NAME)")
    parser.add_argument("--gpus", type=positive_int_list, default=[],
                        help="what-if GPU counts, e.g. 8,16,32: predicted makespan and GPU-hours for each")
    parser.add_argument("--ranks-per-node", type=positive_int, help="treat every N consecutive ranks as one node")
    parser.add_argument("--device", choices=["cpu", "cuda", "emulated"], help="override cluster.device")
    parser.add_argument("--quiet", action="store_true", help="no per-wave lines")
    parser.add_argument("--pilot", type=positive_float, metavar="SECONDS",
                        help="then train the spec for SECONDS in RUN_DIR/pilot and calibrate every prediction by "
                             "what that run measured (its costs beyond the timed steps: start-up, hand-offs, "
                             "checkpoints, shared cores); kept in profile.json")
    parser.add_argument("--pilot-follows", action="store_true", help=argparse.SUPPRESS)  # the ranks: no report yet
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    env = read_job_env(os.environ)
    if (env.size or 1) > 1:
        if args.pilot is not None:
            raise UserError("--pilot: starts its own fleet run, so it needs fleet profile outside an MPI job; inside "
                            "one, run the pilot as a job step of its own (fleet run SPEC --run-dir DIR, stopped by the "
                            "checkpoint signal) and train with --calibrate-from DIR")
        epilogue = None if args.pilot_follows else (lambda spec, run_dir: report(spec, run_dir, args.gpus))
        options = TrainOptions(args.spec, args.run_dir, args.ranks_per_node, args.device, args.quiet,
                               profile_only=True, epilogue=epilogue)
        return train_entry(options)
    return _launch(args)


def _launch(args: argparse.Namespace) -> int:
    spec = load_run_spec(args.spec, run_dir=args.run_dir)
    check_partitions(spec)
    command = mpiexec_command(spec, args.spec, launcher_for(find_mpiexec()), sys.executable, args.quiet, args.device)
    command[command.index("train")] = "profile"
    if args.gpus:
        command += ["--gpus", ",".join(str(g) for g in args.gpus)]
    if args.pilot is not None:
        command.append("--pilot-follows")
    outcome = start_here(command, f"profiling on {command[command.index('-n') + 1]} ranks", spec.run_dir, start_timeout(spec))
    code = finish(spec, outcome, training=False)
    if code != 0 or args.pilot is None:
        return code
    run_pilot(args.spec, Path(spec.run_dir), args.pilot, args.device, start_timeout(spec))
    report(spec, Path(spec.run_dir), args.gpus)
    return 0


def report(spec, run_dir: Path, what_if_gpus: list[int]) -> None:
    """Rank 0, once every rank has profiled: the plan and the predicted makespans."""
    print(dry_run(spec, run_dir, tuple(what_if_gpus)), flush=True)
