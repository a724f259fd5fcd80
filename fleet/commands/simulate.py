"""``fleet simulate``: compare scheduling policies in the discrete-event simulator.

Input is a profile (``profile.json``) or a built-in workload (``--workload paper100``). For
each GPU count and policy it prints the makespan, the speedups over Baseline and over
Homogeneous, the makespan relative to the two lower bounds, rounds, mean GPU wait and the
samples decoded relative to Baseline (averaged over ``--seeds`` seeds), and can draw the
paper-style charts. ``--workload scale --models 1000`` is a large synthetic ensemble;
``--workload family --seed S`` is instance S of the workload family
(:mod:`fleet.schedule.workload_family`), on its own drawn GPU count unless ``--gpus`` is given;
``--family-shape``, ``--family-ratio`` and ``--family-gpus-per-node`` fix what a cell fixes;
``--noise-model stop-rule`` takes the true epochs from each model's learning curve
(:mod:`fleet.schedule.noise`). ``--partitions P`` splits the data into P partitions on the
nodes (model hopping): the hopping policies are compared with ``mop``, Cerebro's scheduler.
``--groups G --group-skew S`` learns over groups (issue 47): a built-in workload's first
``--configurations`` models trained on each of G groups of Zipf(S) sizes
(`fleet.schedule.group_workload`), the four policies over groups against the grouped lower bound;
with ``--partitions P`` on data partitioned by its groups (small groups whole on one part, large
ones sharded: `group_workload.on_parts`), where ``grouped`` plans visits of each group's parts.

``--true-rates PROFILE`` makes the models train at PROFILE's rates while the policies plan with
the input's: each run then weighs the rates it measures and adopts them where that pays, and
``auto`` (``policy: auto``) may hand the run to another policy, as a real run does (the same
driver code, `fleet.schedule.adapting`); the switches are listed under the table.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict, replace

from fleet.commands._family import FAMILY, add_family_options, family_cell, family_lines, family_parameters
from fleet.commands._args import (
    fraction,
    names_of,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
    positive_int_list,
)
from fleet.errors import UserError
from fleet.prediction import search_lines
from fleet.report.schedule_charts import write_schedule_charts
from fleet.report.table import format_duration, format_table
from fleet.schedule import (POLICIES, WORKLOADS, Overheads, RateTable, Scenario, create_policy, noisy_estimates, simulate,
                            whole_epochs)
from fleet.schedule.choice import AUTO
from fleet.schedule.early_stop import METHODS as EARLY_STOP_METHODS
from fleet.schedule.early_stop import EarlyStopError, EarlyStopSettings
from fleet.schedule.partitions import PartitionError, nodes_per_partition
from fleet.schedule.group_workload import grouped_bound, grouped_scenario, on_parts
from fleet.schedule.planners import GROUP_POLICIES, HOPPING_POLICIES
from fleet.schedule.compare import compare, summarize
from fleet.schedule.noise import NOISE_MODELS, noisy_scenario
from fleet.schedule.workload_family import DEFAULT_MODELS, REPORTING_SEEDS, FamilyCell, family_instance
from fleet.schedule_io import epochs_from_profile, load_profile, profile_scenario

DEFAULT_POLICIES = "baseline,homogeneous,fleet-l,fleet-g"
DEFAULT_HOPPING_POLICIES = ",".join(HOPPING_POLICIES)
WORKLOAD_NAMES = (*WORKLOADS, FAMILY)


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "simulate",
        help="compare scheduling policies in the simulator",
        description="Simulate policies on a profile or a built-in workload and compare them.",
    )
    parser.add_argument("profile", nargs="?", help="profile.json (or use --workload)")
    parser.add_argument("--workload", help=f"built-in workload instead of a profile ({', '.join(WORKLOAD_NAMES)})")
    parser.add_argument("--models", type=positive_int,
                        help=f"models in the built-in workload (paper100: 100, scale: 1000, family: {DEFAULT_MODELS})")
    parser.add_argument("--gpus", type=positive_int_list,
                        help="GPU counts, e.g. 20,40,80 (required but with --workload family: its instances' own)")
    parser.add_argument(
        "--policies", type=names_of([*POLICIES, AUTO]),
        help=f"comma-separated (default: {DEFAULT_POLICIES}; with --partitions: {DEFAULT_HOPPING_POLICIES}); "
             f"{AUTO}: the one predicted first, switching as policy: auto does",
    )
    parser.add_argument(
        "--true-rates", metavar="PROFILE",
        help="profile.json of the rates the models really train at (the same model ids); the policies plan "
             "with the input's and adapt to what they measure, as a run does",
    )
    parser.add_argument(
        "--partitions", type=positive_int,
        help="split the data into this many partitions over the nodes (model hopping; the node count of "
             "every --gpus must be a multiple of it)",
    )
    _add_group_options(parser)
    _add_seed_options(parser)
    add_family_options(parser)
    parser.add_argument(
        "--max-epochs", type=positive_float, help="epochs assumed for models whose profile has no 'epochs'"
    )
    parser.add_argument(
        "--estimate-noise", default=0.0, type=fraction, help="multiply each epoch estimate by U(1-x, 1+x)"
    )
    parser.add_argument(
        "--noise-model", default="uniform", choices=NOISE_MODELS,
        help="uniform: estimates x U(1-x, 1+x); stop-rule: true epochs from each model's learning curve and "
             "the stop rule, the curve reported every epoch, estimates as uniform (built-in workloads only)",
    )
    parser.add_argument(
        "--checkpoint-s", type=non_negative_float, metavar="SECONDS",
        help="seconds each checkpoint and each restore takes, whatever the model's size (as a run measured "
             "them; default: 5 s + 3 x the parameter bytes at 1 GB/s)",
    )
    parser.add_argument(
        "--early-stop", choices=[m for m in EARLY_STOP_METHODS if m != "none"],
        help="also run each policy stopping models early at rungs (as scheduler.early_stop does), on the models' "
             "learning curves (--noise-model stop-rule; without curves only the rung arithmetic: how many go on, "
             "not which); adds model-epochs and GPU-hours",
    )
    parser.add_argument("--min-epochs", type=positive_int, default=1, help="--early-stop: the first rung (default 1)")
    parser.add_argument("--reduction", type=positive_float, default=3.0,
                        help="--early-stop: eta, the reduction factor between rungs (> 1; default 3)")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.add_argument("--chart", help="write a PNG with speedup and GPU-time charts")
    parser.set_defaults(func=run)
    return parser


def _add_group_options(parser: argparse.ArgumentParser) -> None:
    """Learning over groups: how many groups, their skew, configurations, decoding."""
    parser.add_argument("--groups", type=positive_int,
                        help="learn over this many groups (with --workload): each of the first --configurations "
                             "models trained on every group")
    parser.add_argument("--group-skew", type=non_negative_float, default=1.0,
                        help="--groups: the Zipf exponent of the group sizes (default 1.0; 0: equal groups)")
    parser.add_argument("--configurations", type=positive_int, default=4,
                        help="--groups: configurations per group (default 4)")
    parser.add_argument("--decode-per-node", type=positive_float, metavar="SAMPLES_S",
                        help="--groups: samples/s one node's preprocessors decode (default: decoding is free)")
    parser.add_argument("--own-decode", type=positive_float, metavar="SAMPLES_S",
                        help="--groups: samples/s a trainer decodes its own data, as model-task's do (default: free)")


def _add_seed_options(parser: argparse.ArgumentParser) -> None:
    """Which seeds: how many, from which (a family's instances are its seeds)."""
    parser.add_argument("--seeds", default=1, type=positive_int, help="number of seeds to average over (default: 1)")
    parser.add_argument("--seed", default=0, type=non_negative_int,
                        help="the first seed: seeds SEED..SEED+SEEDS-1 (default: 0); with --workload family, the "
                             f"instance (reporting seeds: {REPORTING_SEEDS.start}-{REPORTING_SEEDS.stop - 1})")


def run(args: argparse.Namespace) -> int:
    if args.groups:
        return _run_groups(args)
    seeds, noise = args.seeds, args.estimate_noise
    policies = _policies(args)
    cell = family_cell(args)
    scenarios, label = _scenarios(args, noise, cell)
    if args.partitions:
        scenarios, label = _partitioned(scenarios, args.partitions), f"{label}, {args.partitions} partitions"
    if args.true_rates:
        scenarios, label = _true_rates(scenarios, args.true_rates), f"{label}, true rates from {args.true_rates}"
    costs = Overheads() if args.checkpoint_s is None else Overheads(latency_s=args.checkpoint_s,
                                                                      bandwidth=float("inf"))
    early = _early_stop(args)
    if early is not None and args.noise_model != "stop-rule":
        label += "; early stopping on the rung arithmetic only (no learning curves: how many models go on, not which)"
    rows = [row for gpu_counts, chosen in _runs(args, cell)
            for row in compare(scenarios, gpu_counts, policies, chosen, costs, adapt=bool(args.true_rates),
                               early_stop=early)]
    summary = summarize(rows)
    if args.chart:
        _chart(summary, args.chart, label)
    searches = _searches(args)
    if args.json:
        document = {"input": label, "seeds": seeds, "estimate_noise": noise, "rows": summary,
                    **({} if cell is None else {"family": [asdict(p) for p in family_parameters(args, cell)]}),
                    **({"searches": searches[1:]} if searches else {})}
        print(json.dumps(document if args.noise_model == "uniform" else {**document, "noise_model": args.noise_model},
                         indent=1))
    else:
        print(_render(summary, label, seeds, noise, args.chart, hopping=bool(args.partitions),
                      early_stop=args.early_stop is not None))
        if cell is not None:
            print("\n".join(family_lines(args, cell)))
        for line in searches[1:]:
            print(line)
    return 0


def _searches(args: argparse.Namespace) -> list[str]:
    """`search_lines` of a profile's adaptive searches (its ``searches``, written by `fleet profile`)."""
    if args.profile is None:
        return []
    rates = load_profile(args.profile)
    return search_lines(rates.extra.get("searches") or {}, rates)


def _runs(args: argparse.Namespace, cell: FamilyCell | None) -> list[tuple[list[int], range]]:
    """``(GPU counts, seeds)`` to compare: ``--gpus`` for every seed, or (a family's instances
    without ``--gpus``) each seed on its own GPU count."""
    seeds = range(args.seed, args.seed + args.seeds)
    if args.gpus is not None:
        return [(args.gpus, seeds)]
    if cell is None:
        raise UserError("--gpus: required (only --workload family has GPU counts of its own)")
    return [([p.gpus], range(p.seed, p.seed + 1)) for p in family_parameters(args, cell)]


def _policies(args: argparse.Namespace) -> list[str]:
    """The policies to compare; on partitioned data only hopping ones, whose GPU counts fit."""
    if not args.partitions:
        return args.policies or DEFAULT_POLICIES.split(",")
    chosen = args.policies or list(HOPPING_POLICIES)
    if wrong := [name for name in chosen if name not in (*HOPPING_POLICIES, AUTO)]:
        raise UserError(f"--policies: {', '.join(wrong)} cannot run on partitioned data (--partitions); "
                        f"choose from {', '.join(HOPPING_POLICIES)}")
    return chosen


def _partitioned(scenarios, parts: int):
    """The scenarios with their epoch split into `parts` even partitions on the nodes."""

    def split(gpus: int, seed: int) -> Scenario:
        scenario = scenarios(gpus, seed)
        nodes = math.ceil(gpus / scenario.rates.gpus_per_node)
        try:
            nodes_per_partition(parts, nodes)
        except PartitionError as exc:
            raise UserError(f"--partitions: on --gpus {gpus} ({nodes} nodes of {scenario.rates.gpus_per_node}): "
                            f"{exc}") from None
        return replace(scenario, partition_sizes=(scenario.rates.samples_per_epoch / parts,) * parts)

    return split


def _early_stop(args: argparse.Namespace):
    """``scenario -> EarlyStopSettings`` for --early-stop (rungs below the scenario's longest
    model), or None; a bad --reduction or --min-epochs is one line."""
    if args.early_stop is None:
        return None

    def settings(scenario: Scenario) -> EarlyStopSettings:
        longest = max(*scenario.true_epochs, *whole_epochs(scenario.epochs_estimate))
        try:
            return EarlyStopSettings(method=args.early_stop, max_epochs=longest, min_epochs=args.min_epochs,
                                     reduction=args.reduction)
        except EarlyStopError as exc:
            raise UserError(f"--{exc.field.replace('_', '-')}: {exc.problem}") from None

    return settings


def _true_rates(scenarios, path: str):
    """The scenarios with the models training at `path`'s rates, planned with the input's."""
    truth = load_profile(path)

    def measured(gpus: int, seed: int) -> Scenario:
        scenario = scenarios(gpus, seed)
        return replace(scenario, rates=_same_models(truth, scenario.rates, path), planning_rates=scenario.rates)

    return measured


def _same_models(truth: RateTable, planned: RateTable, path: str) -> RateTable:
    """`truth` in `planned`'s order and machine facts; a model missing from it is an error."""
    known = set(truth.ids)
    if missing := [m for m in planned.ids if m not in known]:
        raise UserError(f"--true-rates: {path} has no rates for {len(missing)} model(s) of the input, "
                        f"e.g. {', '.join(missing[:3])}")
    if truth.gpus_per_node != planned.gpus_per_node:
        raise UserError(f"--true-rates: {path} has gpus_per_node {truth.gpus_per_node}, the input "
                        f"{planned.gpus_per_node}")
    return RateTable(tuple(truth.profile(m) for m in planned.ids), planned.gpus_per_node,
                     planned.samples_per_epoch, planned.extra)


def _scenarios(args: argparse.Namespace, noise: float, cell: FamilyCell | None):
    """``(gpus, seed) -> Scenario`` for the chosen input, and a label for it."""
    if (args.profile is None) == (args.workload is None):
        raise UserError("simulate: give either a profile.json or --workload NAME (not both)")
    if cell is not None:
        models = args.models or DEFAULT_MODELS

        def from_family(gpus: int, seed: int) -> Scenario:
            return noisy_scenario(family_instance(seed, models, cell).workload, gpus, seed, noise, args.noise_model)

        last = args.seed + args.seeds - 1
        label = f"workload family ({cell.label}; {models} models; seed {args.seed}" + (f"..{last})" if last > args.seed else ")")
        return from_family, label + ("" if args.noise_model == "uniform" else ", stop-rule noise")
    if args.workload is not None:
        if args.workload not in WORKLOADS:
            raise UserError(f"--workload: unknown {args.workload!r}; valid: {', '.join(WORKLOAD_NAMES)}")
        make, sized = WORKLOADS[args.workload], {} if args.models is None else {"models": args.models}

        def from_workload(gpus: int, seed: int) -> Scenario:
            return noisy_scenario(make(seed, **sized), gpus, seed, noise, args.noise_model)

        label = f"workload {args.workload}" + (f" ({args.models} models)" if args.models else "")
        return from_workload, label + ("" if args.noise_model == "uniform" else ", stop-rule noise")
    if args.noise_model != "uniform" or args.models is not None:
        raise UserError("simulate: --noise-model stop-rule and --models need a built-in --workload")
    rates = load_profile(args.profile)
    epochs, source = epochs_from_profile(rates, args.max_epochs, args.profile)
    truth = whole_epochs(epochs)

    def from_profile(gpus: int, seed: int) -> Scenario:
        estimates = noisy_estimates(epochs, seed, noise) if noise else epochs
        return profile_scenario(rates, truth, estimates, gpus)

    return from_profile, f"{args.profile} (epochs from {source})"


def _render(summary: list[dict], label: str, seeds: int, noise: float, chart: str | None,
            hopping: bool = False, early_stop: bool = False) -> str:
    versus = (["vs mop", "hops"], lambda s: [f"{s['speedup_mop']:.2f}x", f"{s['hops']:.0f}"]) if hopping else \
        (["vs base", "vs homog"], lambda s: [f"{s['speedup_baseline']:.2f}x", f"{s['speedup_homogeneous']:.2f}x"])
    rows = [
        [s["gpus"], _policy_cell(s), format_duration(s["makespan_s"]), *versus[1](s), f"{s['makespan_lb2']:.2f}",
         f"{s['makespan_lb1']:.2f}", f"{s['rounds']:.1f}", format_duration(s["mean_gpu_wait_s"]),
         f"{s['decoded_vs_baseline']:.2f}", *([f"{s['model_epochs']:,.0f}", f"{s['gpu_hours']:,.1f}"] if early_stop else [])]
        for s in summary
    ]
    headers = ["gpus", "policy", "makespan", *versus[0], "/LB2", "/LB1", "rounds", "gpu wait", "decoded",
               *(["epochs", "GPU h"] if early_stop else [])]
    noise_note = f", epoch estimates x U({1 - noise:g},{1 + noise:g})" if noise else ""
    lines = [f"{label}; mean of {seeds} seed(s){noise_note}", format_table(headers, rows), *_switch_lines(summary)]
    if chart:
        lines.append(f"wrote {chart}")
    return "\n".join(lines)


def _policy_cell(row: dict) -> str:
    """The policy, and for ``auto`` what it chose first (``auto (fleet-g)``)."""
    if row["policy"] != AUTO:
        return row["policy"]
    return f"{AUTO} ({'/'.join(row['chosen'])})"


def _switch_lines(summary: list[dict]) -> list[str]:
    """One line per ``auto`` run that handed over to another policy, in time order."""
    lines = []
    for row in summary:
        for seed, switches in enumerate(row["switches"]):
            steps = ", then ".join(f"{w['from']} -> {w['to']} at {format_duration(w['at_s'])}" for w in switches)
            if steps:
                lines.append(f"{AUTO} on {row['gpus']} GPUs, seed {seed}: switched {steps}")
    return lines


def _chart(summary: list[dict], path: str, label: str) -> None:
    write_schedule_charts(summary, path, title=label)


def _run_groups(args: argparse.Namespace) -> int:
    """``--groups``: the policies over groups on a built-in workload, each makespan over the
    grouped lower bound (`grouped_bound`), averaged over the seeds."""
    if args.workload not in WORKLOADS or args.gpus is None:
        raise UserError(f"--groups: needs --workload ({', '.join(WORKLOADS)}) and --gpus")
    able = ("grouped",) if args.partitions else GROUP_POLICIES  # on parts: visits of the groups' parts
    if wrong := [p for p in (args.policies or []) if p not in able]:
        why = "does not plan visits of data partitioned by its groups" if args.partitions else "may mix groups in a stream"
        raise UserError(f"--policies: {', '.join(wrong)} {why}; with --groups choose from {', '.join(able)}")
    policies = args.policies or list(able)
    make, sized = WORKLOADS[args.workload], {} if args.models is None else {"models": args.models}
    rows = []
    for gpus in args.gpus:
        runs = {p: [] for p in policies}
        for seed in range(args.seed, args.seed + args.seeds):
            try:
                scenario = grouped_scenario(make(seed, **sized), args.groups, args.group_skew, gpus,
                                            args.configurations, args.decode_per_node, args.own_decode)
                scenario = on_parts(scenario, args.partitions) if args.partitions else scenario
            except (ValueError, PartitionError) as exc:
                raise UserError(f"--groups: {exc}") from None
            bound = grouped_bound(scenario)
            for policy in policies:
                result = simulate(create_policy(policy, seed=seed), scenario)
                runs[policy].append((result.makespan, result.makespan / bound, result.samples_decoded))
        rows += [{"gpus": gpus, "policy": p, **{k: sum(r[i] for r in v) / len(v) for i, k in
                                               enumerate(("makespan_s", "makespan_lb", "decoded"))}}
                 for p, v in runs.items()]
    parts = f", on {args.partitions} parts (fleet data partition --group-by)" if args.partitions else ""
    label = (f"workload {args.workload}: {args.configurations} configurations x {args.groups} groups "
             f"(Zipf {args.group_skew:g}){parts}; mean of {args.seeds} seed(s)")
    if args.json:
        print(json.dumps({"input": label, "rows": rows}, indent=1))
        return 0
    table = [[r["gpus"], r["policy"], format_duration(r["makespan_s"]), f"{r['makespan_lb']:.2f}",
              f"{r['decoded']:,.0f}"] for r in rows]
    print(label + "\n" + format_table(["gpus", "policy", "makespan", "/LB", "decoded"], table))
    return 0
