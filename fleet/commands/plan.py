"""``fleet plan``: simulate a policy on a profile and write the plan (``plan.json``).

The plan is the simulated run of the policy on the profile's rates, with each model's
``epochs`` from ``profile.json`` (or ``--max-epochs`` where missing) standing in for the
epochs it will really need; the output says which. With ``--spec``, the policy, its options
(``scheduler:``) and the seed are the spec's; without, ``--policy`` runs with its defaults.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from fleet.commands._args import non_negative_int, one_of, positive_float, positive_int
from fleet.prediction import candidates_for, decode_limit_line, search_lines, simulated_early_stop, with_partitions
from fleet.report.plan_text import render_plan
from fleet.schedule import POLICIES, Overheads, Policy, create_policy, lower_bounds, simulate, whole_epochs
from fleet.errors import UserError
from fleet.schedule.choice import AUTO, CANDIDATES, choose_policy
from fleet.schedule.planners import HOPPING_POLICIES, policy_class
from fleet.spec.search import searches_of
from fleet.schedule_io import epochs_from_profile, load_profile, plan_document, profile_scenario, write_json
from preprocess.grouped import load_run_spec

DEFAULT_POLICY = "fleet-g"


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "plan",
        help="plan rounds and GPU placements for a profiled ensemble",
        description="Simulate a scheduling policy on profile.json and write plan.json.",
    )
    parser.add_argument("profile", help="profile.json written by `fleet profile`")
    parser.add_argument("--gpus", required=True, type=positive_int, help="number of GPUs (trainer slots) M")
    parser.add_argument("--policy", type=one_of(POLICIES),
                        help=f"planner (default: the spec's with --spec, else {DEFAULT_POLICY})")
    parser.add_argument("--spec", help="ensemble YAML whose scheduler section (policy and its options) and seed "
                                       "to plan with; --policy picks another policy, with that policy's defaults")
    parser.add_argument(
        "--max-epochs", type=positive_float, help="epochs assumed for models whose profile has no 'epochs'"
    )
    parser.add_argument("--seed", type=non_negative_int,
                        help="seed for randomised policies (default: the spec's with --spec, else 0)")
    parser.add_argument("--out", help="where to write plan.json (default: beside the profile)")
    parser.add_argument("--json", action="store_true", help="print plan.json instead of the table")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    gpus = args.gpus
    make_policy = PolicyMaker(args)
    rates = load_profile(args.profile)
    estimates, source = epochs_from_profile(rates, args.max_epochs, args.profile)
    truth = whole_epochs(estimates)
    scenario = profile_scenario(rates, truth, estimates, gpus)
    if make_policy.spec is not None:
        scenario = with_partitions(scenario, make_policy.spec)
    name = args.policy or make_policy.spec_policy
    runs = policy_class(name if name != AUTO else "grouped" if scenario.partition_groups else "mop")
    if scenario.partition_sizes and not (runs.hops or runs.visits_groups and scenario.partition_groups):
        raise UserError(f"--policy: {name} cannot run on the spec's partitioned data; choose from "
                        f"{', '.join(HOPPING_POLICIES)}")
    early_stop = simulated_early_stop(make_policy.spec) if make_policy.spec else None  # models stop at rungs
    if name == AUTO:
        choice = choose_policy(make_policy, scenario, Overheads(),
                               candidates=candidates_for(make_policy.spec) if make_policy.spec else CANDIDATES,
                               early_stop=early_stop)
        print(f"policy auto: {choice.describe()}")
        name = choice.name
    result = simulate(make_policy(name), scenario, Overheads(), early_stop=early_stop)
    lb2 = lower_bounds(rates, truth, gpus).lb2
    document = plan_document(result, rates.gpus_per_node, source, lb2)
    out = Path(args.out) if args.out else Path(args.profile).resolve().parent / "plan.json"
    write_json(out, document)
    if args.json:
        print(json.dumps(document, indent=1))
    else:
        print(render_plan(document, rates, source, out))
        if scenario.decode_rate is not None:
            print(decode_limit_line(scenario.decode_rate))
        searches = rates.extra.get("searches") or searches_of(make_policy.spec.models if make_policy.spec else ())
        for line in search_lines(searches, rates)[1:]:  # adaptive searches: what is known before the run
            print(line)
    return 0


class PolicyMaker:
    """``name -> Policy`` for planning: with ``--spec``, the spec's options for its own policy
    and its seed; else every policy with its defaults. `spec_policy`: the spec's policy name
    (``--spec``), else the default."""

    def __init__(self, args: argparse.Namespace):
        self.spec = load_run_spec(args.spec, check_paths=False) if args.spec else None
        self.seed = args.seed if args.seed is not None else (self.spec.seed if self.spec else 0)
        self.spec_policy = self.spec.scheduler.policy if self.spec else DEFAULT_POLICY

    def __call__(self, name: str) -> Policy:
        if self.spec is None:
            return create_policy(name, seed=self.seed)
        return self.spec.scheduler.create_policy(self.seed, name)
