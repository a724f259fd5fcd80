"""The engine of a bundle (issue 49): several models of one architecture trained on one trainer
over the batches their stream shares, for the runtime's `BundleTraining`.

`create_bundle` builds it from each member's options and the checkpoint bytes it resumes from:
a `fleet.engines.torch.fused.FusedTorchEngine` (one fused model) on a real device, a
`SequentialBundle` of emulated engines on the emulated device, where a bundle's step takes the
sum of its members' profiled step times. Both answer the same calls by model id, and a
member's state is the bytes its own engine's checkpoint holds, so checkpoints stay per model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fleet.engines._base import Engine
from fleet.engines.emulated import NO_RATES, EmulatedEngine
from fleet.engines.options import EngineOptions
from fleet.errors import UserError
from fleet.schedule.rates import RateTable
from fleet.spec.sections import Device


class SequentialBundle:
    """A bundle's engines stepped one after another on each shared batch: the bundle's calls
    (`FusedTorchEngine`'s) over one `Engine` per member. Not thread-safe.

    Args:
        engines: one engine per member, each already loaded from its checkpoint where it has one.
    """

    def __init__(self, engines: Sequence[Engine]):
        self._engines = {engine.model_id: engine for engine in engines}

    @property
    def model_ids(self) -> list[str]:
        return list(self._engines)

    def train_step(self, x: Any, y: np.ndarray) -> dict[str, float]:
        """Each member's step on the batch; each member's mean loss, by model id."""
        return {model_id: engine.train_step(x, y) for model_id, engine in self._engines.items()}

    def end_epoch(self, model_id: str) -> None:
        self._engines[model_id].end_epoch()

    def lr(self, model_id: str) -> float:
        return self._engines[model_id].lr

    def evaluate_with_probabilities(self, x: np.ndarray, y: np.ndarray, batch_size: int = 256
                                    ) -> dict[str, tuple[dict[str, float], np.ndarray | None]]:
        return {model_id: engine.evaluate_with_probabilities(x, y, batch_size)
                for model_id, engine in self._engines.items()}

    def predict(self, x: np.ndarray, batch_size: int = 256) -> dict[str, np.ndarray | None]:
        return {model_id: engine.predict(x, batch_size) for model_id, engine in self._engines.items()}

    def member_state_bytes(self, model_id: str) -> bytes:
        return self._engines[model_id].state_bytes()

    def parameter_count(self, model_id: str) -> int:
        return self._engines[model_id].num_parameters

    def leave(self, model_id: str) -> None:
        """Take a member out; the others go on as they were."""
        del self._engines[model_id]


def create_bundle(members: Sequence[EngineOptions], states: Mapping[str, bytes], *, rates: RateTable | None = None,
                  epoch_limits: Mapping[str, int | None] | None = None) -> Any:
    """The engine of a bundle of `members` (same device, threads, shape and classes), each
    loaded from its checkpoint's engine bytes in `states` where it has one.

    On ``emulated``, a `SequentialBundle` of `EmulatedEngine`s driven by `rates` (each converging
    after its `epoch_limits` entry); else a `FusedTorchEngine`.

    Raises:
        UserError: the models may not fuse, a checkpoint that is not its model's, or an
            emulated device without rates.
    """
    device = members[0].device
    if getattr(device, "value", device) == Device.EMULATED.value:
        if rates is None:
            raise UserError(NO_RATES)
        limits = epoch_limits or {}
        engines = [EmulatedEngine(options, rates, epochs_to_converge=limits.get(options.model.id))
                   for options in members]
        for engine in engines:
            if engine.model_id in states:
                engine.load_state_bytes(states[engine.model_id])
        return SequentialBundle(engines)
    from fleet.engines.torch.fused import FusedTorchEngine  # torch: heavy, imported where a bundle trains

    decoded = {}
    for model_id, data in states.items():
        try:
            decoded[model_id] = FusedTorchEngine.codec.decode(data)
        except ValueError as exc:
            raise UserError(f"checkpoint of model {model_id!r}: {exc}") from None
    return FusedTorchEngine(members, decoded)
