"""`fleet validate SPEC`: check a spec and print its expanded ensemble."""

from __future__ import annotations

import argparse
import json
import sys

from fleet.inspect import describe_ensemble
from fleet.report.table import format_table, human
from preprocess.grouped import load_run_spec


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "validate",
        help="check a spec and list its models",
        description="Validate an ensemble spec and print the expanded ensemble: id, family, "
        "key parameters, parameter count and approximate FLOPs per sample.",
    )
    parser.add_argument("spec", help="ensemble YAML file")
    parser.add_argument("--json", action="store_true", help="print the ensemble as JSON")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    spec = load_run_spec(args.spec, say=lambda line: print(f"fleet: {line}", file=sys.stderr if args.json else sys.stdout))
    summary = describe_ensemble(spec)
    for notice in summary.notices:  # on stderr with --json, which keeps stdout JSON
        print(f"fleet: {notice}", file=sys.stderr if args.json else sys.stdout)
    if args.json:
        print(json.dumps(summary.as_dict(), indent=2))
        return 0
    data, early_stop = spec.data, spec.early_stop_settings().method
    print(
        f"{spec.name}: {len(spec.models)} models · data {data.source.value} "
        f"{summary.num_classes} classes, input {data.channels}x{data.image_size[0]}x{data.image_size[1]} · "
        f"cluster {spec.cluster.nodes}x{spec.cluster.gpus_per_node} {spec.cluster.device.value} · "
        f"policy {spec.scheduler.policy}" + (f" · early stopping {early_stop}" if early_stop != "none" else "")
    )
    rows = [
        (r.id, r.family, r.key_params, human(r.stats.parameters), human(r.stats.flops_per_sample))
        for r in summary.rows
    ]
    print(format_table(("id", "family", "key params", "params", "FLOPs/sample"), rows))
    return 0
