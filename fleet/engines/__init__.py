"""Engines: the narrow waist between the runtime's trainers and a deep-learning framework.

`Engine` (in `_base.py`) is the contract of one model replica, built from one `EngineOptions`
(`options.py`); `Framework` the contract of everything else fleet does with a framework (its
zoo, state codec and devices). Frameworks are found by name in `fleet.engines.registry`
(``torch``: `fleet.engines.torch`);
`fleet.engines.factory.create_engine` builds a model's engine, or an `EmulatedEngine`
(`fleet.engines.emulated`) on ``cluster.device: emulated``.

Importing this package imports no framework (the spec takes its valid names from here).
"""

from __future__ import annotations

from fleet.engines._base import Engine, EnginePhase, Framework, ModelStats, ModelZoo, StateCodec, StateLayout
from fleet.engines.options import EngineOptions
from fleet.engines.registry import DEFAULT_FRAMEWORK, FRAMEWORKS, framework_names, get_framework

__all__ = [
    "DEFAULT_FRAMEWORK",
    "FRAMEWORKS",
    "Engine",
    "EngineOptions",
    "EnginePhase",
    "Framework",
    "ModelStats",
    "ModelZoo",
    "StateCodec",
    "StateLayout",
    "framework_names",
    "get_framework",
]
