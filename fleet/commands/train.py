"""`fleet train SPEC`: the per-rank entry point, started by mpiexec, srun or jsrun."""

from __future__ import annotations

import argparse

from fleet.commands._args import CALIBRATE_HELP, positive_int
from fleet.rank_entry import train_entry
from fleet.runtime.rank import TrainOptions


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "train",
        help="per-rank entry under mpiexec/srun/jsrun",
        description="Train an ensemble as one rank of an MPI job. Start it on every rank, e.g. "
        "`srun fleet train spec.yaml` or `mpiexec -n 6 fleet train spec.yaml`; `fleet run` does this for you.",
    )
    parser.add_argument("spec", help="ensemble YAML file")
    parser.add_argument("--run-dir", help="run directory (default: the spec's run_dir, else runs/NAME)")
    parser.add_argument(
        "--ranks-per-node", type=positive_int,
        help="treat every N consecutive ranks as one node (one machine acting as several nodes)",
    )
    parser.add_argument("--device", choices=["cpu", "cuda", "emulated"], help="override cluster.device")
    parser.add_argument("--quiet", action="store_true", help="no per-epoch lines (batch logs)")
    parser.add_argument("--calibrate-from", metavar="DIR", help=CALIBRATE_HELP)
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    options = TrainOptions(args.spec, args.run_dir, args.ranks_per_node, args.device, args.quiet,
                           calibrate_from=args.calibrate_from)
    return train_entry(options)
