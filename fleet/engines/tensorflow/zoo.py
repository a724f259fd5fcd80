"""`KerasZoo`: the Keras twins of fleet's zoo families, and user models.

The twins of ``mlp``, ``cnn``, ``resnet``, ``densenet`` and ``lstm`` take the same params
(validated by `fleet.spec.families`), with the same defaults and meaning as the torch
families of `fleet.engines.torch.zoo`, and have exactly as many trainable parameters as the
torch networks for the same params, input shape and classes; `KerasZoo.describe` counts them,
and their FLOPs as the torch zoo's `stats` does, without building them. The deeper three are in
`fleet.engines.tensorflow.zoo_blocks`. Every model takes fleet's ``(N, C, H, W)`` float32
batches and returns ``(N, K)`` logits: the ``mlp`` flattens them in torch's order; the
convolutional families transpose them to channels-last first (TF's CPU convolutions are NHWC
only: ``channels_first`` raises UnimplementedError on TF 2.21); the ``lstm`` reads the rows
as time steps, a row's pixels x channels as features, as torch's.
Differences from torch, none of them in the counts: batch norm's moving variance is updated
with the biased batch variance (torch uses the unbiased one), and the ``cnn`` flattens its
last map channels-last.

Initialisation follows torch's: ``mlp`` and linear weights uniform in +-1/sqrt(fan_in) (the
``mlp``'s and ``lstm``'s biases too; the other heads' are zero), convolutions He-normal over
fan-out, batch norm one and zero, LSTM weights and biases uniform in +-1/sqrt(hidden). Each
initializer and dropout layer is seeded from the model's seed, so the same seed gives the
same weights and dropout masks in any process.

A user model is ``package.module:function``, called as
``function(input_shape=(C, H, W), num_classes=K, **params)``; it must return a
`keras.Model` taking ``(N, C, H, W)`` batches. Its weights are drawn under
`keras.utils.set_random_seed` (Python's and numpy's global RNGs are restored afterwards).
"""
from __future__ import annotations

import importlib
import math
import random
import threading
from collections.abc import Mapping
from typing import Any, Callable

import keras
import numpy as np

from fleet.engines._base import InputShape, ModelStats, ModelZoo
from fleet.engines.tensorflow.zoo_blocks import (Layers, Seeds, batch_norm, build_densenet, build_lstm, build_resnet,
                                                 channels_last, count_densenet, count_lstm, count_resnet, dense,
                                                 linear_counts)
from fleet.errors import UserCodeError, UserError
from fleet.spec.families import family_params, is_user_family

_SEEDED_BUILD = threading.Lock()
"""Serialises user-model builds: they borrow the global RNGs under `keras.utils.set_random_seed`."""


def conv_plan(input_shape: InputShape, channels: tuple[int, ...]) -> list[tuple[int, int, int, int, tuple[int, int]]]:
    """The ``cnn``'s layers: (cin, cout, height, width, pooling kernel) per conv, where the
    map is ``height x width`` at the conv; a kernel of (1, 1) means no pooling."""
    cin, height, width = input_shape
    plan = []
    for cout in channels:
        kernel = (2 if height >= 2 else 1, 2 if width >= 2 else 1)
        plan.append((cin, cout, height, width, kernel))
        cin, height, width = cout, height // kernel[0], width // kernel[1]
    return plan


def build_mlp(input_shape: InputShape, num_classes: int, seeds: Seeds, hidden: tuple[int, ...],
              dropout: float) -> keras.Model:
    """Flatten, then Dense-ReLU-dropout per entry of `hidden`, then a linear head."""
    inputs = keras.Input(shape=input_shape)
    x, features = keras.layers.Flatten()(inputs), math.prod(input_shape)
    for width in hidden:
        x = dense(width, features, seeds, zero_bias=False, activation="relu")(x)
        x = keras.layers.Dropout(dropout, seed=seeds.next())(x)
        features = width
    return keras.Model(inputs, dense(num_classes, features, seeds, zero_bias=False)(x), name="mlp")


def build_cnn(input_shape: InputShape, num_classes: int, seeds: Seeds, channels: tuple[int, ...], hidden: int,
              kernel_size: int, dropout: float) -> keras.Model:
    """conv('same', no bias)-BN-ReLU-maxpool layers, flatten, optional hidden layer, linear head."""
    inputs, x = channels_last(input_shape)
    plan = conv_plan(input_shape, channels)
    for _, cout, _, _, kernel in plan:
        x = keras.layers.Conv2D(cout, kernel_size, padding="same", use_bias=False,
                                kernel_initializer=seeds.conv_weight())(x)
        x = batch_norm()(x)
        x = keras.layers.ReLU()(x)
        if kernel != (1, 1):
            x = keras.layers.MaxPooling2D(kernel)(x)
    x = keras.layers.Flatten()(x)
    features = _cnn_features(input_shape, plan)
    if hidden:
        x = dense(hidden, features, seeds, zero_bias=True, activation="relu")(x)
        x = keras.layers.Dropout(dropout, seed=seeds.next())(x)
        features = hidden
    return keras.Model(inputs, dense(num_classes, features, seeds, zero_bias=True)(x), name="cnn")


def _cnn_features(input_shape: InputShape, plan: list) -> int:
    if not plan:
        return math.prod(input_shape)
    _, cout, height, width, kernel = plan[-1]
    return cout * (height // kernel[0]) * (width // kernel[1])


def count_mlp(input_shape: InputShape, num_classes: int, hidden: tuple[int, ...], dropout: float) -> Layers:
    return linear_counts(math.prod(input_shape), [*hidden, num_classes])


def count_cnn(input_shape: InputShape, num_classes: int, channels: tuple[int, ...], hidden: int, kernel_size: int,
              dropout: float) -> Layers:
    """Every conv with its batch norm (2 x cout), then the optional hidden layer and the head."""
    k, plan = kernel_size, conv_plan(input_shape, channels)
    layers = [(k * k * cin * cout + 2 * cout, k * k * cin * cout * h * w) for cin, cout, h, w, _ in plan]
    return layers + linear_counts(_cnn_features(input_shape, plan), [*([hidden] if hidden else []), num_classes])


BUILDERS: dict[str, Callable[..., keras.Model]] = {
    "mlp": build_mlp, "cnn": build_cnn, "resnet": build_resnet, "densenet": build_densenet, "lstm": build_lstm,
}
COUNTERS: dict[str, Callable[..., Layers]] = {
    "mlp": count_mlp, "cnn": count_cnn, "resnet": count_resnet, "densenet": count_densenet, "lstm": count_lstm,
}
"""Each family's (trainable parameters, multiply-adds per sample) per layer, from its validated params."""


def count_parameters(family: str, params: Mapping[str, Any], input_shape: InputShape,
                     num_classes: int) -> tuple[int, int]:
    """(trainable parameters, forward FLOPs per sample) of a zoo family, without building it;
    FLOPs are 2 x multiply-adds, as `fleet.engines.torch.zoo.stats` counts them."""
    checked = family_params(family, params)
    layers = COUNTERS[family](input_shape, num_classes, **checked)
    return sum(p for p, _ in layers), 2 * sum(m for _, m in layers)


def _user_code(family: str, what: str, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``function(...)``, anything it raises (Ctrl-C aside) a one-line `UserCodeError`."""
    try:
        return function(*args, **kwargs)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - anything the user's code raises is the user's error
        detail = " ".join(str(exc).split())[:200]
        raise UserCodeError(f"family {family!r}", f"{what} raised {type(exc).__name__}: {detail}") from exc


def build_user_model(family: str, params: Mapping[str, Any], input_shape: InputShape, num_classes: int,
                     seed: int | None) -> keras.Model:
    """Import and call ``package.module:function``; check that it returns a `keras.Model`."""
    module_name, _, function_name = family.partition(":")
    module = _user_code(family, f"importing {module_name!r}", importlib.import_module, module_name)
    builder = getattr(module, function_name, None)
    if not callable(builder):
        raise UserCodeError(f"family {family!r}", f"module {module_name!r} has no function {function_name!r}")
    with _SEEDED_BUILD:
        saved = random.getstate(), np.random.get_state()
        try:
            if seed is not None:
                keras.utils.set_random_seed(seed)
            model = _user_code(family, f"{function_name}()", builder, input_shape=tuple(input_shape),
                               num_classes=num_classes, **params)
        finally:
            random.setstate(saved[0])
            np.random.set_state(saved[1])
    if not isinstance(model, keras.Model):
        raise UserCodeError(f"family {family!r}",
                            f"{function_name}() returned a {type(model).__name__}, expected a keras.Model")
    return model


def trainable_count(model: keras.Model) -> int:
    return sum(int(np.prod(v.shape)) for v in model.trainable_variables)


class KerasZoo(ModelZoo):
    """The zoo's families (``mlp``, ``cnn``, ``resnet``, ``densenet``, ``lstm``) and
    ``package.module:function`` as Keras models."""

    def build(self, family: str, params: Mapping[str, Any], input_shape: InputShape, num_classes: int, *,
              seed: int | None = None) -> keras.Model:
        shape = _checked_shape(input_shape, num_classes)
        if is_user_family(family):
            return build_user_model(family, params, shape, num_classes, seed)
        checked = family_params(family, params)
        return BUILDERS[family](shape, num_classes, Seeds(seed), **checked)

    def describe(self, family: str, params: Mapping[str, Any], input_shape: InputShape,
                 num_classes: int) -> ModelStats:
        """Zoo families are counted without building them; a user model is built, and its
        FLOPs are estimated as 2 per parameter (a dense network's figure)."""
        shape = _checked_shape(input_shape, num_classes)
        if is_user_family(family):
            count = trainable_count(self.build(family, params, shape, num_classes, seed=0))
            return ModelStats(count, 4 * count, 2 * count)
        count, flops = count_parameters(family, params, shape, num_classes)
        return ModelStats(count, 4 * count, flops)

    def parameter_bytes(self, family: str, params: Mapping[str, Any], input_shape: InputShape,
                        num_classes: int) -> int | None:
        if is_user_family(family):
            return None
        return 4 * count_parameters(family, params, _checked_shape(input_shape, num_classes), num_classes)[0]


def _checked_shape(input_shape: InputShape, num_classes: int) -> InputShape:
    shape = tuple(int(d) for d in input_shape)
    if len(shape) != 3 or any(d < 1 for d in shape):
        raise UserError(f"input shape: expected (channels, height, width) of positive sizes, got {input_shape}")
    if num_classes < 1:
        raise UserError(f"num_classes: expected a positive integer, got {num_classes}")
    return shape  # type: ignore[return-value]
