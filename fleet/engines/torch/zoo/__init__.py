"""The model zoo: torch networks for small (and not so small) images, one module per family.

`build_model` turns a family name and its validated parameters (see `fleet.spec.families`)
into a `torch.nn.Module` taking ``(N, C, H, W)`` float images and returning ``(N, K)`` logits;
`describe` gives its size and approximate cost, `parameter_bytes` its size without building
it. A family written ``package.module:function`` is a user model (see `user`). This is the
torch zoo, inside its engine as the Keras zoo is inside its own (`fleet.engines.tensorflow.zoo`):
`fleet.engines.torch.framework.TorchZoo` offers it to the rest of fleet as a
`fleet.engines.ModelZoo`. What both zoos share is framework-neutral: the families' params
(`fleet.spec.families.family_params`) and `InputShape` and `ModelStats` (`fleet.engines._base`).
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Mapping

import torch
from torch import nn

from fleet.engines._base import InputShape, ModelStats
from fleet.engines.torch.zoo import cnn, densenet, lstm, mlp, resnet, user
from fleet.engines.torch.zoo._layers import SeededDropout, set_dropout_generator
from fleet.engines.torch.zoo.stats import model_stats
from fleet.errors import UserError
from fleet.spec.families import family_params, is_user_family

BUILDERS: dict[str, Callable[..., nn.Module]] = {
    "resnet": resnet.build,
    "densenet": densenet.build,
    "cnn": cnn.build,
    "mlp": mlp.build,
    "lstm": lstm.build,
}

_SEEDED_BUILD = threading.Lock()
"""Serialises seeded builds: they borrow torch's global CPU RNG under `fork_rng`."""


def _check_shape(input_shape: InputShape, num_classes: int) -> None:
    if len(input_shape) != 3 or any(int(d) < 1 for d in input_shape):
        raise UserError(f"input shape: expected (channels, height, width) of positive sizes, got {input_shape}")
    if num_classes < 1:
        raise UserError(f"num_classes: expected a positive integer, got {num_classes}")


def _build(family: str, params: Mapping[str, Any], input_shape: InputShape, num_classes: int) -> nn.Module:
    shape = tuple(int(d) for d in input_shape)
    _check_shape(shape, num_classes)  # type: ignore[arg-type]
    if is_user_family(family):
        return user.build(family, params, shape, num_classes)  # type: ignore[arg-type]
    params = family_params(family, params)
    return BUILDERS[family](shape, num_classes, **params)


def build_model(
    family: str,
    params: Mapping[str, Any],
    input_shape: InputShape,
    num_classes: int,
    *,
    seed: int | None = None,
) -> nn.Module:
    """Build a family's network on the CPU, in training mode.

    Args:
        family: a zoo family (``resnet``, ``densenet``, ``cnn``, ``mlp``, ``lstm``) or
            ``package.module:function``.
        params: the family's parameters; missing ones take the schema's defaults.
        input_shape: ``(channels, height, width)`` of one sample.
        num_classes: number of output logits.
        seed: when given, the weights are drawn from torch's CPU RNG seeded with it, so the
            same seed gives the same weights in any process; the global RNG state is restored
            afterwards.

    Raises:
        UserError: unknown family, invalid params, or a user model that cannot be built.
    """
    if seed is None:
        return _build(family, params, input_shape, num_classes)
    with _SEEDED_BUILD, torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return _build(family, params, input_shape, num_classes)


# A zoo model up to this size is counted on the CPU: on torch's meta device its forward pass
# runs through torch's decompositions, whose first use loads its compiler stack (dynamo, sympy:
# 1.2 s and 500 modules) for a count that takes milliseconds on the CPU.
COUNT_ON_CPU_BYTES = 256 << 20


def describe(family: str, params: Mapping[str, Any], input_shape: InputShape, num_classes: int) -> ModelStats:
    """Parameters, parameter bytes and approximate forward FLOPs per sample of a model.

    FLOPs are 2 x multiply-adds of Conv2d, Linear and LSTM layers (four gates per step),
    counted with forward hooks on one dummy sample; batch norm, activations and pooling are
    neglected, so the figure is approximate. Leaves torch's global RNG untouched. A zoo
    family is counted on the CPU, or past `COUNT_ON_CPU_BYTES` on torch's meta device
    (nothing allocated); a user model is built on
    the CPU, run once and its output checked (`fleet.engines.torch.zoo.user.check_forward`).

    Raises:
        UserError: the model cannot be built, or a user model's code fails or returns logits
            of the wrong shape (a `fleet.errors.UserCodeError` naming what its code did).
    """
    shape = tuple(int(d) for d in input_shape)
    if not is_user_family(family):
        with torch.device("meta"):  # shapes and counts only: nothing is allocated, however large
            model = _build(family, params, shape, num_classes)  # type: ignore[arg-type]
            if sum(p.numel() * p.element_size() for p in model.parameters()) > COUNT_ON_CPU_BYTES:
                return model_stats(model, shape)  # type: ignore[arg-type]
        with torch.random.fork_rng(devices=[]):
            return model_stats(_build(family, params, shape, num_classes), shape)  # type: ignore[arg-type]
    model = build_model(family, params, shape, num_classes, seed=0)  # type: ignore[arg-type]
    user.check_forward(family, model, shape, num_classes)  # type: ignore[arg-type]
    return user.call_user_code(family, "forward", model_stats, model, shape)


def parameter_bytes(family: str, params: Mapping[str, Any], input_shape: InputShape, num_classes: int) -> int | None:
    """Bytes of the model's parameters, counted on torch's meta device (nothing is allocated);
    None when the model cannot be built there (a user model that computes with its weights
    while it is built, say): then building it for real decides."""
    try:
        with torch.device("meta"):
            module = _build(family, params, input_shape, num_classes)
    except Exception:  # noqa: BLE001 - any failure here only means "not countable on meta"
        return None
    return sum(p.numel() * p.element_size() for p in module.parameters())


__all__ = [
    "BUILDERS",
    "SeededDropout",
    "build_model",
    "describe",
    "parameter_bytes",
    "set_dropout_generator",
]
