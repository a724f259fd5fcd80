"""Planners (policies) by name; see :mod:`fleet.schedule._base` for the protocol."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fleet.schedule._base import Policy
from fleet.schedule.options import PolicyOptions
from fleet.schedule.planners.adaptive import FleetAdaptive
from fleet.schedule.planners.baseline import Baseline
from fleet.schedule.planners.fleet_global import FleetGlobal
from fleet.schedule.planners.fleet_local import FleetLocal
from fleet.schedule.planners.group_parallel import GroupParallel
from fleet.schedule.planners.group_task import GroupTask
from fleet.schedule.planners.grouped import Grouped
from fleet.schedule.planners.hopping import FleetHop, ModelHopper
from fleet.schedule.planners.homogeneous import Homogeneous
from fleet.schedule.planners.model_task import ModelTask

POLICIES: dict[str, type[Policy]] = {
    "fleet-g": FleetGlobal,
    "fleet-l": FleetLocal,
    "baseline": Baseline,
    "homogeneous": Homogeneous,
    "fleet-adaptive": FleetAdaptive,
    "mop": ModelHopper,
    "fleet-hop": FleetHop,
    "grouped": Grouped,
    "group-task": GroupTask,
    "model-task": ModelTask,
    "group-parallel": GroupParallel,
}
"""Policy classes by registry name: the one list of valid names (the spec's and the CLI's).
Every class takes its ``Options`` instance first and ``seed=`` as a keyword."""

PAPER_POLICIES = ("baseline", "homogeneous", "fleet-l", "fleet-g")
"""The four policies of the FLEET paper's evaluation."""

GROUP_POLICIES = ("grouped", "group-task", "model-task", "group-parallel")
"""The policies of learning over groups (`data.group_by`, issue 47): ours and its three
baselines; each keeps every stream to one group's models (``auto`` chooses among them)."""

HOPPING_POLICIES = tuple(name for name, policy in POLICIES.items() if policy.hops)
"""The policies that plan visits of partitioned data (model hopping)."""


def policy_class(name: str) -> type[Policy]:
    """The policy class registered as ``name``.

    Raises:
        KeyError: for an unknown name; the message lists the valid ones.
    """
    try:
        return POLICIES[name]
    except KeyError:
        raise KeyError(f"unknown policy {name!r}; valid: {', '.join(POLICIES)}") from None


def policy_options(name: str, options: Mapping[str, Any]) -> PolicyOptions:
    """The checked options of policy ``name``: those in ``options``, defaults for the rest.

    Raises:
        KeyError: for an unknown policy name.
        OptionError: an option the policy does not take (the message names the policy and
            the options it takes), or a value the policy's declaration rejects.
    """
    return policy_class(name).Options.parse(options, name)


def create_policy(name: str, seed: int = 0, **options: Any) -> Policy:
    """A new policy object by registry name: every command builds its policy here.

    Args:
        name: the policy's registry name (a key of :data:`POLICIES`).
        seed: seeds the randomised policies; the others ignore it.
        **options: the policy's options by name (see its ``Options``); those not given take
            their defaults.

    Raises:
        KeyError: for an unknown name; the message lists the valid ones.
        OptionError: as :func:`policy_options`.
    """
    return policy_class(name)(policy_options(name, options), seed=seed)


__all__ = ["POLICIES", "PAPER_POLICIES", "GROUP_POLICIES", "Grouped", "GroupTask", "GroupParallel", "ModelTask", "HOPPING_POLICIES", "FleetHop", "ModelHopper", "create_policy", "policy_class", "policy_options", "Baseline",
           "FleetAdaptive", "FleetGlobal", "FleetLocal", "Homogeneous"]
