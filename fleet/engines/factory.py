"""`create_engine`: the engine of one model replica, for the runtime's trainers and the local runner."""

from __future__ import annotations

from fleet.engines._base import Engine
from fleet.engines.emulated import NO_RATES, EmulatedEngine
from fleet.engines.options import EngineOptions
from fleet.engines.registry import get_framework
from fleet.errors import UserError
from fleet.schedule.rates import RateTable
from fleet.spec.sections import Device


def create_engine(
    options: EngineOptions,
    *,
    rates: RateTable | None = None,
    group_size: int = 1,
    epochs_to_converge: int | None = None,
) -> Engine:
    """The engine of ``options.model`` on ``options.device``.

    ``device="emulated"`` gives an `EmulatedEngine` driven by `rates` (the profile),
    `group_size` and `epochs_to_converge`: it stands in for every framework and imports none.
    Any other device gives the engine of the model's ``framework`` (see
    `fleet.engines.registry`), built with the options' threads and determinism.

    Raises:
        UserError: a bad device or model, a framework that is not installed, or an emulated
            device without rates.
    """
    if getattr(options.device, "value", options.device) == Device.EMULATED.value:
        if rates is None:
            raise UserError(NO_RATES)
        return EmulatedEngine(options, rates, group_size=group_size, epochs_to_converge=epochs_to_converge)
    return get_framework(options.model.framework).create_engine(options)
