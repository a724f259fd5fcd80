"""The ensemble spec: YAML -> frozen, validated objects (`load_spec`, `Spec`).

Only pydantic, yaml and the pure planner package `fleet.schedule` (the policy registry and its
options) are imported here; the engines' zoos and `preprocess` build from it.
"""

from fleet.spec._base import SpecError
from fleet.spec.families import FAMILIES, is_user_family
from fleet.spec.load import Spec, load_spec, parse_spec
from fleet.spec.search import ModelSpec
from fleet.spec.sections import (
    OPS,
    POLICIES,
    ClusterSpec,
    DataSpec,
    Device,
    EarlyStopSpec,
    Fuse,
    LRSchedule,
    OpName,
    Optimizer,
    RuntimeSpec,
    ScheduleKind,
    SchedulerSpec,
    Source,
    StopMetric,
    StopRule,
    TrainSpec,
)
from fleet.spec.yamlfile import read_yaml

__all__ = [
    "FAMILIES",
    "OPS",
    "POLICIES",
    "ClusterSpec",
    "DataSpec",
    "Device",
    "EarlyStopSpec",
    "Fuse",
    "LRSchedule",
    "ModelSpec",
    "OpName",
    "Optimizer",
    "RuntimeSpec",
    "ScheduleKind",
    "SchedulerSpec",
    "Source",
    "Spec",
    "SpecError",
    "StopMetric",
    "StopRule",
    "TrainSpec",
    "is_user_family",
    "load_spec",
    "parse_spec",
    "read_yaml",
]
