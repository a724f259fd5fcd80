"""`create_engine`: the engine of one model replica, for the runtime's trainers and the local runner."""

from __future__ import annotations

from fleet.engines._base import Engine, InputShape
from fleet.engines.emulated import NO_RATES, EmulatedEngine
from fleet.engines.registry import get_framework
from fleet.errors import UserError
from fleet.schedule.rates import RateTable
from fleet.spec.search import ModelSpec
from fleet.spec.sections import Device


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
    `group_size` and `epochs_to_converge`: it stands in for every framework and imports none.
    Any other device gives the engine of the model's ``framework`` (see
    `fleet.engines.registry`), built with `threads` and `deterministic`.

    Raises:
        UserError: a bad device or model, a framework that is not installed, or an emulated
            device without rates.
    """
    if getattr(device, "value", device) == Device.EMULATED.value:
        if rates is None:
            raise UserError(NO_RATES)
        return EmulatedEngine(
            model, input_shape, num_classes, rates, group_size=group_size, epochs_to_converge=epochs_to_converge
        )
    framework = get_framework(model.framework)
    return framework.create_engine(model, input_shape, num_classes, device=device, threads=threads,
                                   deterministic=deterministic)
