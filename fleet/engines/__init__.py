"""Engines: the narrow waist between the runtime's trainers and a deep-learning framework.

`Engine` (in `_base.py`) is the contract; `TorchEngine` implements it for PyTorch and
`EmulatedEngine` for ``cluster.device: emulated`` (steps that take the profiled time).
"""

from __future__ import annotations

from fleet.engines._base import Engine, EnginePhase
from fleet.engines.emulated import NO_RATES, EmulatedEngine
from fleet.engines.schedule import learning_rate
from fleet.engines.torch_engine import TorchEngine
from fleet.errors import UserError
from fleet.models import InputShape
from fleet.schedule.rates import RateTable
from fleet.spec.search import ModelSpec


def create_engine(
    model: ModelSpec,
    input_shape: InputShape,
    num_classes: int,
    device: str = "cpu",
    threads: int | None = None,
    deterministic: bool = False,
    *,
    rates: RateTable | None = None,
    group_size: int = 1,
    epochs_to_converge: int | None = None,
) -> Engine:
    """The engine for `model` on `device`.

    ``device="emulated"`` gives an `EmulatedEngine` driven by `rates` (the profile),
    `group_size` and `epochs_to_converge` (ignored by the torch engine); any other device a
    `TorchEngine` (see it for the other arguments). Raises `UserError` for a bad device or
    model, or an emulated device without rates.
    """
    if getattr(device, "value", device) == "emulated":
        if rates is None:
            raise UserError(NO_RATES)
        return EmulatedEngine(
            model, input_shape, num_classes, rates, group_size=group_size, epochs_to_converge=epochs_to_converge
        )
    return TorchEngine(model, input_shape, num_classes, device=device, threads=threads, deterministic=deterministic)


__all__ = ["EmulatedEngine", "Engine", "EnginePhase", "TorchEngine", "create_engine", "learning_rate"]
