"""Pure scheduling core of fleet: rates, flotillas, placement, planners, simulator, bounds.

Nothing in this package imports MPI, torch or does file I/O (a test enforces it): the
runtime's coordinator and the simulator both drive the planners through the protocol in
:mod:`fleet.schedule._base`. Reading and writing ``profile.json`` lives in
:mod:`fleet.schedule_io`.
"""

from fleet.schedule._base import (
    END_ROUND,
    NO_DECISION,
    CheckpointCompleted,
    ClusterView,
    Decision,
    EpochCompleted,
    Event,
    Member,
    ModelConverged,
    ModelPromoted,
    ModelState,
    ModelView,
    Policy,
    PolicyError,
    StreamPlan,
    StreamView,
)
from fleet.schedule.bounds import Bounds, lower_bounds, malleable_bound, simple_bound, training_times
from fleet.schedule.costs import Overheads
from fleet.schedule.flotilla import Flotilla, FlotillaMember, create_flotilla
from fleet.schedule.placement import node_count, place
from fleet.schedule.options import OptionError, PolicyOptions
from fleet.schedule.planners import PAPER_POLICIES, POLICIES, create_policy, policy_options
from fleet.schedule.rates import (
    ModelProfile,
    ProfileFormatError,
    RateTable,
    extrapolate_rate,
    threshold_gpus,
)
from fleet.schedule.simulator import Cluster, Scenario, SimResult, Timeline, simulate, whole_epochs
from fleet.schedule.workloads import WORKLOADS, Workload, noisy_estimates, paper100, scale
from fleet.schedule.noise import NOISE_MODELS, noisy_scenario

__all__ = [
    "END_ROUND", "NO_DECISION", "CheckpointCompleted", "ClusterView", "Decision", "EpochCompleted",
    "Event", "Member", "ModelConverged", "ModelPromoted", "ModelState", "ModelView", "Policy", "PolicyError",
    "StreamPlan", "StreamView", "Bounds", "lower_bounds", "malleable_bound", "simple_bound",
    "training_times", "Overheads", "Flotilla", "FlotillaMember", "create_flotilla", "node_count",
    "place", "OptionError", "PolicyOptions", "PAPER_POLICIES", "POLICIES", "create_policy", "policy_options",
    "ModelProfile", "ProfileFormatError",
    "RateTable", "extrapolate_rate", "threshold_gpus", "Cluster", "Scenario", "SimResult", "whole_epochs",
    "Timeline", "simulate", "WORKLOADS", "Workload", "noisy_estimates", "paper100", "scale",
    "NOISE_MODELS", "noisy_scenario",
]
