"""Parameter schemas of the model zoo's families (pure: no torch here).

The engines' zoos (`fleet/engines/torch/zoo/`, `fleet/engines/tensorflow/zoo.py`) build the
networks from the validated, default-filled parameters (`family_params`).
A family written as ``package.module:function`` is a user model: its params are passed
to the function as keyword arguments, unchecked here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pydantic import Field, NonNegativeInt, PositiveInt, ValidationError, field_validator

from fleet.errors import UserError
from fleet.spec._base import Section, format_validation_error

USER_FAMILY = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*$")


def _positive_ints(value: Any, lengths: range, what: str) -> tuple[int, ...]:
    """Check a list of positive integers whose length lies in `lengths`."""
    ok = (
        isinstance(value, (list, tuple))
        and len(value) in lengths
        and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)
    )
    if not ok:
        shown = list(value) if isinstance(value, (list, tuple)) else value
        raise ValueError(f"expected {what}, got {shown}")
    return tuple(value)


class ResNetParams(Section):
    """ResNet-like: four stages of residual blocks (strides 1, 2, 2, 2)."""

    blocks: tuple[int, ...] = (2, 2, 2, 2)
    width: PositiveInt = 16
    bottleneck: bool = False

    @field_validator("blocks", mode="before")
    @classmethod
    def _blocks(cls, value: Any) -> tuple[int, ...]:
        return _positive_ints(value, range(4, 5), "4 positive integers")


class DenseNetParams(Section):
    """DenseNet-like: 1-4 dense blocks of `blocks[k]` layers each, with transitions."""

    blocks: tuple[int, ...] = (4, 4, 4)
    growth_rate: PositiveInt = 12
    init_features: PositiveInt | None = None
    bn_size: PositiveInt = 4
    compression: float = Field(0.5, gt=0.0, le=1.0)

    @field_validator("blocks", mode="before")
    @classmethod
    def _blocks(cls, value: Any) -> tuple[int, ...]:
        return _positive_ints(value, range(1, 5), "1 to 4 positive integers")


class CNNParams(Section):
    """Plain CNN: conv3x3-BN-ReLU layers, each followed by 2x2 max pooling while the map allows."""

    channels: tuple[int, ...] = (32, 64)
    hidden: NonNegativeInt = 128
    kernel_size: PositiveInt = 3
    dropout: float = Field(0.0, ge=0.0, lt=1.0)

    @field_validator("channels", mode="before")
    @classmethod
    def _channels(cls, value: Any) -> tuple[int, ...]:
        return _positive_ints(value, range(1, 9), "1 to 8 positive integers")

    @field_validator("kernel_size")
    @classmethod
    def _odd(cls, value: int) -> int:
        if value % 2 == 0:
            raise ValueError(f"expected an odd kernel size, got {value}")
        return value


class MLPParams(Section):
    """Multi-layer perceptron on the flattened image."""

    hidden: tuple[int, ...] = (256,)
    dropout: float = Field(0.0, ge=0.0, lt=1.0)

    @field_validator("hidden", mode="before")
    @classmethod
    def _hidden(cls, value: Any) -> tuple[int, ...]:
        return _positive_ints(value, range(0, 9), "0 to 8 positive integers")


class LSTMParams(Section):
    """LSTM over the image rows (a row is a time step of width x channels features)."""

    hidden: PositiveInt = 128
    layers: int = Field(1, ge=1, le=4)
    bidirectional: bool = False


FAMILIES: dict[str, type[Section]] = {
    "resnet": ResNetParams,
    "densenet": DenseNetParams,
    "cnn": CNNParams,
    "mlp": MLPParams,
    "lstm": LSTMParams,
}


def is_user_family(family: str) -> bool:
    """True for ``package.module:function`` user models."""
    return bool(USER_FAMILY.match(family))


def family_error(family: str) -> str:
    valid = ", ".join(sorted(FAMILIES))
    return f"unknown family {family!r} (valid: {valid}, or package.module:function)"


def family_params(family: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """Validate a zoo family's params and fill its defaults (raises `UserError`)."""
    if family not in FAMILIES:
        raise UserError(family_error(family))
    try:
        return FAMILIES[family].model_validate(dict(params)).model_dump()
    except ValidationError as exc:
        raise UserError(f"family {family!r}: " + format_validation_error(exc, ("params",))) from None
