"""`fleet submit SPEC --scheduler slurm|lsf`: write a batch script into the run directory and submit it."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from fleet.atomic import atomic_write_text
from fleet.batch import BatchSystem, SubmitOptions, batch_job, render, script_path
from fleet.batch.submit import check_partition, require_submitter, submit
from fleet.commands._args import CALIBRATE_HELP, one_of, positive_int
from fleet.prediction import preprocessors_for
from fleet.runtime.control.setup import check_partitions, check_same_ensemble
from fleet.schedule_io import load_calibration, load_profile
from preprocess.grouped import load_run_spec

SCHEDULERS = ("slurm", "lsf")


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "submit",
        help="write a Slurm or LSF batch script for an ensemble and submit it",
        description="Render a batch script from the spec (nodes, ranks per node = trainers + preprocessors, "
        "GPUs, cores per rank, walltime), write it into the run directory and submit it with sbatch or bsub. "
        "The job checkpoints on USR1 (sent 120 s before the walltime) and requeues itself to resume.",
    )
    parser.add_argument("spec", help="ensemble YAML file")
    parser.add_argument("--scheduler", required=True, type=one_of(SCHEDULERS), metavar="slurm|lsf",
                        help="the batch system")
    parser.add_argument("--run-dir", metavar="DIR", help="run directory (default: the spec's run_dir, else runs/NAME)")
    parser.add_argument("--dry-run", action="store_true", help="write the script, do not submit it")
    parser.add_argument("--time", metavar="T", help="walltime: minutes, HH:MM:SS or D-HH:MM:SS (default: the site's)")
    parser.add_argument("--account", metavar="NAME", help="account/project to charge (Slurm --account, LSF -P)")
    parser.add_argument("--partition", "--queue", dest="partition", metavar="NAME", help="Slurm partition or LSF queue")
    parser.add_argument(
        "--env", action="append", default=[], metavar="KIND:VALUE",
        help="prepare the job's shell, in order, repeatable: conda:NAME, venv:PATH or module:NAME[,NAME...] "
        "(default: run fleet with this Python)",
    )
    parser.add_argument(
        "--preprocessors", type=positive_int, metavar="N",
        help="preprocessor ranks per node when the spec says preprocessors_per_node: auto (default: what the "
        "plan predicted from the run directory's profile.json needs, else 1)",
    )
    parser.add_argument(
        "--cpus-per-task", type=positive_int, metavar="N", help="cores per rank (default: cluster.threads_per_trainer)"
    )
    parser.add_argument("--calibrate-from", metavar="DIR", help=CALIBRATE_HELP)
    parser.add_argument("--launcher-args", metavar="ARGS", help="extra srun/jsrun flags, e.g. '--smpiargs=\"-disable_gpu_hooks\"'")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    system = BatchSystem(args.scheduler)
    if not args.dry_run:
        require_submitter(system)
    spec = load_run_spec(args.spec, run_dir=args.run_dir, say=lambda line: print(f"fleet: {line}"))
    check_partitions(spec)
    preprocessors = args.preprocessors
    if preprocessors is None and spec.cluster.preprocessors_per_node == "auto":
        preprocessors = _profiled_preprocessors(spec)
    options = SubmitOptions(
        system, time=args.time, account=args.account, partition=args.partition, env=tuple(args.env),
        preprocessors=preprocessors, cpus_per_task=args.cpus_per_task, launcher_args=args.launcher_args,
        calibrate_from=args.calibrate_from,
    )
    if args.calibrate_from is not None:  # refused now, not once the job has waited in the queue
        load_calibration(Path(args.calibrate_from), spec.cluster.device.value, required=True)
    job = batch_job(spec, args.spec, options, os.getcwd(), sys.executable)
    check_same_ensemble(Path(job.run_dir), spec)  # the job would refuse it only once it starts
    if not args.dry_run:
        check_partition(system, args.partition, job.nodes)  # it would pend for ever
    path = Path(script_path(job))
    atomic_write_text(path, render(job))
    path.chmod(0o755)
    print(f"fleet: {job.name}: wrote {path}")
    if args.dry_run:
        print(f"fleet: dry run: submit it with: {'sbatch' if system is BatchSystem.SLURM else 'bsub <'} {path}")
        return 0
    job_id = submit(system, path)
    print(f"fleet: submitted {system.value} job {job_id}; output in {job.run_dir}")
    return 0


def _profiled_preprocessors(spec) -> int | None:
    """`preprocessors_per_node: auto` with a profile in the run directory: what the predicted
    plan needs (said on the console); None without a profile that measured decoding."""
    path = Path(spec.run_dir) / "profile.json"
    if not path.exists():
        return None
    needed = preprocessors_for(spec, load_profile(path))
    if needed is None:
        return None
    need, busiest = needed
    print(f"fleet: preprocessors_per_node auto: {need} per node (the {spec.scheduler.policy} plan predicted from "
          f"{path} consumes up to {busiest:,.0f} samples/s)")
    return need
