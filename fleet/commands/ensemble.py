"""`fleet ensemble RUN_DIR [--size K] [--from N]`: Caruana's greedy ensemble selection over the
models' kept validation predictions, scored on the test split against the best single model;
writes RUN_DIR/ensemble.json."""

from __future__ import annotations

import argparse
from pathlib import Path

from fleet.commands._args import positive_int
from fleet.commands._run_dir import run_spec
from fleet.report.run_ensemble import build_ensemble, say_ensemble, write_ensemble

DEFAULT_SIZE = 10


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "ensemble",
        help="greedy ensemble selection over a run's models; writes ensemble.json",
        description="Caruana's greedy ensemble selection with replacement on the validation predictions each model "
        "kept of its best epoch: from the best model of the leaderboard, add the model that most lowers the "
        "ensemble's validation NLL, K steps, and keep the prefix of lowest NLL. Writes RUN_DIR/ensemble.json: the "
        "members and their weights, the selection curve, and accuracy, NLL, ECE and uncertainty (predictive "
        "entropy, mutual information, disagreement) of the ensemble and of the best single model on the test "
        "split (data.test_fraction; on the validation split where there is none, and it says so).",
    )
    parser.add_argument("run_dir", help="the run directory (runs/NAME) of a finished or checkpointed job")
    parser.add_argument("--size", type=positive_int, metavar="K",
                        help=f"greedy steps, the best model counted (default: the spec's ensemble.size, else {DEFAULT_SIZE})")
    parser.add_argument("--from", dest="top", type=positive_int, metavar="N",
                        help="candidates: the N best models of the leaderboard (default: the spec's ensemble.from, "
                        "else every model)")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir)
    section = run_spec(run_dir).ensemble
    size = args.size or (section.size if section else DEFAULT_SIZE)
    top = args.top or (section.from_ if section else None)
    doc = build_ensemble(run_dir, size, top)
    say_ensemble(doc, write_ensemble(run_dir, doc))
    return 0
