"""Engines: the narrow waist between the runtime's trainers and a deep-learning framework.

`Engine` (in `_base.py`) is the contract; `TorchEngine` implements it for PyTorch.
"""

from __future__ import annotations

from fleet.engines._base import Engine, EnginePhase
from fleet.engines.schedule import learning_rate
from fleet.engines.torch_engine import TorchEngine
from fleet.models import InputShape
from fleet.spec.search import ModelSpec


def create_engine(
    model: ModelSpec,
    input_shape: InputShape,
    num_classes: int,
    device: str = "cpu",
    threads: int | None = None,
    deterministic: bool = False,
) -> Engine:
    """The engine for `model` on `device` (only the torch engine exists so far).

    See `TorchEngine` for the arguments; raises `UserError` for a bad device or model.
    """
    return TorchEngine(model, input_shape, num_classes, device=device, threads=threads, deterministic=deterministic)


__all__ = ["Engine", "EnginePhase", "TorchEngine", "create_engine", "learning_rate"]
