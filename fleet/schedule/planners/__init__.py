"""Planners (policies) by name; see :mod:`fleet.schedule._base` for the protocol."""

from __future__ import annotations

from fleet.schedule._base import Policy
from fleet.schedule.planners.adaptive import FleetAdaptive
from fleet.schedule.planners.baseline import Baseline
from fleet.schedule.planners.fleet_global import FleetGlobal
from fleet.schedule.planners.fleet_local import FleetLocal
from fleet.schedule.planners.homogeneous import Homogeneous

POLICIES: dict[str, type[Policy]] = {
    "fleet-g": FleetGlobal,
    "fleet-l": FleetLocal,
    "baseline": Baseline,
    "homogeneous": Homogeneous,
    "fleet-adaptive": FleetAdaptive,
}
"""Policy classes by registry name; every class takes ``seed=`` as a keyword."""

PAPER_POLICIES = ("baseline", "homogeneous", "fleet-l", "fleet-g")
"""The four policies of the FLEET paper's evaluation."""


def create_policy(name: str, seed: int = 0, **options) -> Policy:
    """A new policy object by registry name.

    Raises:
        KeyError: for an unknown name; the message lists the valid ones.
    """
    try:
        cls = POLICIES[name]
    except KeyError:
        raise KeyError(f"unknown policy {name!r}; valid: {', '.join(POLICIES)}") from None
    return cls(seed=seed, **options)


__all__ = ["POLICIES", "PAPER_POLICIES", "create_policy", "Baseline", "FleetAdaptive",
           "FleetGlobal", "FleetLocal", "Homogeneous"]
