"""``fleet simulate --workload family``: the options that fix a cell of the workload family
(:mod:`fleet.schedule.workload_family`), checked into a `FamilyCell`, and each instance's drawn
parameters as the table's footnote."""

from __future__ import annotations

import argparse

from fleet.commands._args import one_of, positive_float, positive_int
from fleet.errors import UserError
from fleet.schedule.workload_family import (
    DEFAULT_MODELS,
    GPUS_PER_NODE_CHOICES,
    RATIO_RANGE,
    SHAPES,
    FamilyCell,
    FamilyError,
    FamilyParameters,
    draw_parameters,
)

FAMILY = "family"
"""The ``--workload`` name of the family."""
OPTIONS = {"shape": "--family-shape", "gpus_ratio": "--family-ratio", "gpus_per_node": "--family-gpus-per-node",
           "models": "--models"}
"""`FamilyError.field` -> the option that sets it."""


def add_family_options(parser: argparse.ArgumentParser) -> None:
    """What a cell of the workload family fixes (the rest is drawn per seed)."""
    group = parser.add_argument_group("--workload family (fleet.schedule.workload_family)")
    group.add_argument("--family-shape", type=one_of(SHAPES),
                       help=f"{', '.join(SHAPES)} (default: issue, issue 46's table; the others fix the epochs "
                            "distribution and draw the rest)")
    group.add_argument("--family-ratio", type=positive_float, metavar="GPUS_PER_MODEL",
                       help=f"GPUs per model, {RATIO_RANGE[0]:g}..{RATIO_RANGE[1]:g} (default: drawn)")
    group.add_argument("--family-gpus-per-node", type=positive_int,
                       help=f"{', '.join(map(str, GPUS_PER_NODE_CHOICES))} (default: drawn)")


def family_cell(args: argparse.Namespace) -> FamilyCell | None:
    """The family cell the options fix (None: not --workload family); a bad value is one line."""
    given = [option for option, value in (("--family-shape", args.family_shape), ("--family-ratio", args.family_ratio),
                                          ("--family-gpus-per-node", args.family_gpus_per_node)) if value is not None]
    if args.workload != FAMILY:
        if given:
            raise UserError(f"{given[0]}: only with --workload family")
        return None
    if args.gpus is not None and args.family_ratio is not None:
        raise UserError("--family-ratio: give it or --gpus, not both (the ratio sets the GPU count)")
    try:
        cell = FamilyCell(args.family_shape or "issue", args.family_ratio, args.family_gpus_per_node)
        draw_parameters(args.seed, args.models or DEFAULT_MODELS, cell)
    except FamilyError as exc:
        raise UserError(f"{OPTIONS[exc.field]}: {exc.problem}") from None
    return cell


def family_parameters(args: argparse.Namespace, cell: FamilyCell) -> list[FamilyParameters]:
    """What each seed's instance was drawn with."""
    models = args.models or DEFAULT_MODELS
    return [draw_parameters(seed, models, cell) for seed in range(args.seed, args.seed + args.seeds)]


def family_lines(args: argparse.Namespace, cell: FamilyCell) -> list[str]:
    """One line per instance: its seed and drawn parameters (its GPU count unless --gpus)."""
    return [f"family seed {p.seed}: {p.describe(own_gpus=args.gpus is None)}" for p in family_parameters(args, cell)]
