"""Building blocks of the Keras zoo (`fleet.engines.tensorflow.zoo`) and its deeper families.

`Seeds` and `dense` are shared by every twin. The ``resnet``, ``densenet`` and ``lstm`` twins
of the torch zoo's (`fleet.engines.torch.zoo`: `resnet`, `densenet`, `lstm`) are planned first
(`resnet_plan`, `densenet_plan`: every convolution with its channels, stride and output size),
and both their builder and their counter read the plan, so the counts cannot drift from the
network. A counter returns ``(parameters, multiply-adds)`` per layer, multiply-adds as
the torch zoo's `stats` counts them: convolutions, linear layers and LSTMs only, no biases.

Torch semantics kept where Keras differs: a strided convolution is zero-padded by
``kernel // 2`` on every side, as torch's (Keras' ``'same'`` pads a stride-2 conv of an
even-sized map on the bottom and right only); and the LSTM cell (`TorchLSTMCell`) has torch's
two bias vectors per layer and direction, so it counts as `torch.nn.LSTM` does.
"""

from __future__ import annotations

import math
import zlib
from typing import Any, NamedTuple, Sequence

import keras
from keras import ops

from fleet.engines._base import InputShape

STAGE_MULTIPLIERS = (1, 2, 4, 8)
STAGE_HALVES = (False, True, True, True)
BOTTLENECK_EXPANSION = 4
Layers = list[tuple[int, int]]
"""(trainable parameters, multiply-adds per sample) of each counted layer."""


class Seeds:
    """Distinct seeds for a model's initializers and dropout layers, derived from its seed
    (None: Keras' unseeded defaults)."""

    def __init__(self, seed: int | None):
        self.seed, self.count = seed, 0

    def next(self) -> int | None:
        if self.seed is None:
            return None
        self.count += 1
        return zlib.crc32(f"{self.seed}:keras:{self.count}".encode()) & 0x7FFFFFFF

    def uniform(self, bound: float) -> keras.initializers.Initializer:
        return keras.initializers.RandomUniform(-bound, bound, seed=self.next())

    def linear_weight(self) -> keras.initializers.Initializer:
        """torch's `nn.Linear` default: uniform in +-1/sqrt(fan_in)."""
        return keras.initializers.VarianceScaling(1 / 3, "fan_in", "uniform", seed=self.next())

    def linear_bias(self, fan_in: int) -> keras.initializers.Initializer:
        return self.uniform(1 / math.sqrt(fan_in))

    def conv_weight(self) -> keras.initializers.Initializer:
        """He-normal over fan-out, as `fleet.engines.torch.zoo._layers.init_weights`."""
        return keras.initializers.VarianceScaling(2.0, "fan_out", "untruncated_normal", seed=self.next())


def dense(width: int, fan_in: int, seeds: Seeds, zero_bias: bool, activation: str | None = None) -> keras.layers.Dense:
    """A Dense layer initialised as torch's `nn.Linear` (bias zero where `init_weights` zeroes it)."""
    bias = "zeros" if zero_bias else seeds.linear_bias(fan_in)
    return keras.layers.Dense(width, activation=activation, kernel_initializer=seeds.linear_weight(),
                              bias_initializer=bias)


def batch_norm() -> keras.layers.BatchNormalization:
    return keras.layers.BatchNormalization(momentum=0.9, epsilon=1e-5)  # torch's momentum 0.1 and eps


def channels_last(input_shape: InputShape) -> tuple[keras.KerasTensor, keras.KerasTensor]:
    """The model's ``(N, C, H, W)`` input, and it transposed to NHWC (TF's CPU convs need it)."""
    inputs = keras.Input(shape=input_shape)
    return inputs, keras.layers.Permute((2, 3, 1))(inputs)


def linear_counts(features: int, widths: Sequence[int]) -> Layers:
    """Counts of a chain of linear layers (with bias) from `features` inputs."""
    layers = []
    for width in widths:
        layers.append((features * width + width, features * width))
        features = width
    return layers


# -- convolutions ---------------------------------------------------------------------------


class Conv(NamedTuple):
    """A bias-free convolution with torch's padding ``kernel // 2``; `height` and `width`
    are those of its output map."""

    cin: int
    cout: int
    kernel: int
    stride: tuple[int, int]
    height: int
    width: int

    @property
    def weights(self) -> int:
        return self.kernel * self.kernel * self.cin * self.cout

    @property
    def macs(self) -> int:
        return self.weights * self.height * self.width


def halving_stride(height: int, width: int) -> tuple[int, int]:
    """Stride 2 along each dimension still wider than one pixel, else 1."""
    return (2 if height > 1 else 1, 2 if width > 1 else 1)


def conv(x: keras.KerasTensor, spec: Conv, seeds: Seeds) -> keras.KerasTensor:
    """`spec` applied to the NHWC map `x`, padded as torch pads it."""
    padding = "same"
    if spec.stride != (1, 1):
        padding = "valid"
        if spec.kernel > 1:
            x = keras.layers.ZeroPadding2D(spec.kernel // 2)(x)
    layer = keras.layers.Conv2D(spec.cout, spec.kernel, strides=spec.stride, padding=padding, use_bias=False,
                                kernel_initializer=seeds.conv_weight())
    return layer(x)


# -- resnet ---------------------------------------------------------------------------------


class Residual(NamedTuple):
    """A residual block: its body's convs (each followed by BN, ReLU between them) and its
    shortcut's projection (conv-BN; None: identity)."""

    body: tuple[Conv, ...]
    projection: Conv | None


def residual(cin: int, width: int, stride: tuple[int, int], height: int, w: int, bottleneck: bool) -> Residual:
    """The block `fleet.engines.torch.zoo.resnet` builds: basic (two 3x3) or bottleneck (1x1, 3x3, 1x1 to 4x width)."""
    out_h, out_w = -(-height // stride[0]), -(-w // stride[1])
    if bottleneck:
        cout = width * BOTTLENECK_EXPANSION
        body = (Conv(cin, width, 1, (1, 1), height, w), Conv(width, width, 3, stride, out_h, out_w),
                Conv(width, cout, 1, (1, 1), out_h, out_w))
    else:
        cout = width
        body = (Conv(cin, width, 3, stride, out_h, out_w), Conv(width, width, 3, (1, 1), out_h, out_w))
    identity = cin == cout and stride == (1, 1)
    return Residual(body, None if identity else Conv(cin, cout, 1, stride, out_h, out_w))


def resnet_plan(input_shape: InputShape, blocks: Sequence[int], width: int,
                bottleneck: bool) -> tuple[Conv, list[Residual]]:
    """The stem conv and the residual blocks of the four stages; stages 2-4 halve the map."""
    channels, height, w = input_shape
    stem, plan, cin = Conv(channels, width, 3, (1, 1), height, w), [], width
    for count, multiplier, halves in zip(blocks, STAGE_MULTIPLIERS, STAGE_HALVES):
        stride = halving_stride(height, w) if halves else (1, 1)
        for i in range(count):
            block = residual(cin, width * multiplier, stride if i == 0 else (1, 1), height, w, bottleneck)
            plan.append(block)
            cin, height, w = block.body[-1].cout, block.body[-1].height, block.body[-1].width
    return stem, plan


def build_resnet(input_shape: InputShape, num_classes: int, seeds: Seeds, blocks: Sequence[int], width: int,
                 bottleneck: bool) -> keras.Model:
    """Stem conv3x3-BN-ReLU, four residual stages, global average pool, linear head."""
    inputs, x = channels_last(input_shape)
    stem, plan = resnet_plan(input_shape, blocks, width, bottleneck)
    x = keras.layers.ReLU()(batch_norm()(conv(x, stem, seeds)))
    for block in plan:
        y = x
        for k, spec in enumerate(block.body):
            y = batch_norm()(conv(y, spec, seeds))
            if k < len(block.body) - 1:
                y = keras.layers.ReLU()(y)
        shortcut = x if block.projection is None else batch_norm()(conv(x, block.projection, seeds))
        x = keras.layers.ReLU()(keras.layers.Add()([y, shortcut]))
    x = keras.layers.GlobalAveragePooling2D()(x)
    features = plan[-1].body[-1].cout if plan else stem.cout
    return keras.Model(inputs, dense(num_classes, features, seeds, zero_bias=True)(x), name="resnet")


def count_resnet(input_shape: InputShape, num_classes: int, blocks: Sequence[int], width: int,
                 bottleneck: bool) -> Layers:
    """Every conv with its batch norm (2 x cout), then the head."""
    stem, plan = resnet_plan(input_shape, blocks, width, bottleneck)
    convs = [stem] + [c for block in plan for c in (*block.body, block.projection) if c is not None]
    features = plan[-1].body[-1].cout if plan else stem.cout
    return [(c.weights + 2 * c.cout, c.macs) for c in convs] + linear_counts(features, [num_classes])


# -- densenet -------------------------------------------------------------------------------


class DenseStage(NamedTuple):
    """A dense block's layers (conv1x1, conv3x3 pairs, each conv after BN-ReLU), then its
    transition: BN-ReLU-conv1x1 and the average pooling kernel ((1, 1): none), or None."""

    layers: tuple[tuple[Conv, Conv], ...]
    transition: tuple[Conv, tuple[int, int]] | None


def densenet_plan(input_shape: InputShape, blocks: Sequence[int], growth_rate: int, init_features: int | None,
                  bn_size: int, compression: float) -> tuple[Conv, list[DenseStage], int]:
    """The stem conv, the stages, and the channels of the last map (init_features None: 2x growth)."""
    channels, height, width = input_shape
    stem_width = init_features if init_features is not None else 2 * growth_rate
    stem = Conv(channels, stem_width, 3, (1, 1), height, width)
    cin, stages, inner = stem.cout, [], bn_size * growth_rate
    for k, count in enumerate(blocks):
        layers = []
        for _ in range(count):
            layers.append((Conv(cin, inner, 1, (1, 1), height, width),
                           Conv(inner, growth_rate, 3, (1, 1), height, width)))
            cin += growth_rate
        transition = None
        if k < len(blocks) - 1:
            cout = max(1, math.floor(compression * cin))
            kernel = halving_stride(height, width)
            transition = (Conv(cin, cout, 1, (1, 1), height, width), kernel)
            cin, height, width = cout, height // kernel[0], width // kernel[1]
        stages.append(DenseStage(tuple(layers), transition))
    return stem, stages, cin


def bn_relu_conv(x: keras.KerasTensor, spec: Conv, seeds: Seeds) -> keras.KerasTensor:
    return conv(keras.layers.ReLU()(batch_norm()(x)), spec, seeds)


def build_densenet(input_shape: InputShape, num_classes: int, seeds: Seeds, blocks: Sequence[int], growth_rate: int,
                   init_features: int | None, bn_size: int, compression: float) -> keras.Model:
    """Stem conv3x3, dense blocks (each layer's output concatenated to its input) with
    transitions between them, BN-ReLU-global average pool, linear head."""
    inputs, x = channels_last(input_shape)
    stem, stages, features = densenet_plan(input_shape, blocks, growth_rate, init_features, bn_size, compression)
    x = conv(x, stem, seeds)
    for stage in stages:
        for bottleneck, growth in stage.layers:
            x = keras.layers.Concatenate()([x, bn_relu_conv(bn_relu_conv(x, bottleneck, seeds), growth, seeds)])
        if stage.transition is not None:
            spec, kernel = stage.transition
            x = bn_relu_conv(x, spec, seeds)
            if kernel != (1, 1):
                x = keras.layers.AveragePooling2D(kernel)(x)
    x = keras.layers.GlobalAveragePooling2D()(keras.layers.ReLU()(batch_norm()(x)))
    return keras.Model(inputs, dense(num_classes, features, seeds, zero_bias=True)(x), name="densenet")


def count_densenet(input_shape: InputShape, num_classes: int, blocks: Sequence[int], growth_rate: int,
                   init_features: int | None, bn_size: int, compression: float) -> Layers:
    """Every conv with the batch norm before it (2 x cin; none before the stem), the final
    batch norm, then the head."""
    stem, stages, features = densenet_plan(input_shape, blocks, growth_rate, init_features, bn_size, compression)
    convs = [c for stage in stages for pair in stage.layers for c in pair]
    convs += [stage.transition[0] for stage in stages if stage.transition is not None]
    layers = [(stem.weights, stem.macs)] + [(c.weights + 2 * c.cin, c.macs) for c in convs]
    return layers + [(2 * features, 0)] + linear_counts(features, [num_classes])


# -- lstm -----------------------------------------------------------------------------------


class TorchLSTMCell(keras.layers.Layer):
    """An LSTM cell as `torch.nn.LSTM`'s: gates i, f, g, o (Keras' order too), an input and a
    recurrent bias (Keras' cell has one), every weight uniform in +-1/sqrt(units).

    Args:
        units: the hidden size.
        seeds: the model's seeds, one per weight.
    """

    def __init__(self, units: int, seeds: Seeds, **kwargs: Any):
        super().__init__(**kwargs)
        self.units, self.state_size, self.output_size = units, [units, units], units
        self._initializers = [seeds.uniform(1 / math.sqrt(units)) for _ in range(4)]

    def build(self, input_shape: tuple[int | None, ...]) -> None:
        four = 4 * self.units
        shapes = {"kernel": (input_shape[-1], four), "recurrent_kernel": (self.units, four), "bias": (four,),
                  "recurrent_bias": (four,)}
        for (name, shape), initializer in zip(shapes.items(), self._initializers):
            setattr(self, name, self.add_weight(shape=shape, initializer=initializer, name=name))

    def call(self, inputs: Any, states: Sequence[Any]) -> tuple[Any, list[Any]]:
        h, c = states
        z = ops.matmul(inputs, self.kernel) + self.bias + ops.matmul(h, self.recurrent_kernel) + self.recurrent_bias
        i, f, g, o = ops.split(z, 4, axis=-1)
        c = ops.sigmoid(f) * c + ops.sigmoid(i) * ops.tanh(g)
        h = ops.sigmoid(o) * ops.tanh(c)
        return h, [h, c]


def lstm_layer(x: keras.KerasTensor, units: int, bidirectional: bool, seeds: Seeds) -> keras.KerasTensor:
    """One LSTM layer's whole output sequence; bidirectional: forward and backward outputs
    concatenated per time step, as torch's (the backward one re-reversed into time order)."""
    forward = keras.layers.RNN(TorchLSTMCell(units, seeds), return_sequences=True)(x)
    if not bidirectional:
        return forward
    backward = keras.layers.RNN(TorchLSTMCell(units, seeds), return_sequences=True, go_backwards=True)(x)
    return keras.layers.Concatenate()([forward, ops.flip(backward, axis=1)])


def build_lstm(input_shape: InputShape, num_classes: int, seeds: Seeds, hidden: int, layers: int,
               bidirectional: bool) -> keras.Model:
    """The image's rows as time steps (a row's pixels x channels, pixel-major, as features),
    `layers` LSTM layers, the last step's output into a linear head (torch's default init)."""
    channels, height, width = input_shape
    inputs, x = channels_last(input_shape)
    x = keras.layers.Reshape((height, width * channels))(x)
    for _ in range(layers):
        x = lstm_layer(x, hidden, bidirectional, seeds)
    features = hidden * (2 if bidirectional else 1)
    return keras.Model(inputs, dense(num_classes, features, seeds, zero_bias=False)(x[:, -1, :]), name="lstm")


def count_lstm(input_shape: InputShape, num_classes: int, hidden: int, layers: int, bidirectional: bool) -> Layers:
    """Per layer and direction: four gates' input and recurrent weights and two biases, at
    `height` time steps; then the head."""
    channels, height, width = input_shape
    directions, features, counts = 2 if bidirectional else 1, width * channels, []
    for _ in range(layers):
        weights = 4 * hidden * (features + hidden)
        counts.append((directions * (weights + 8 * hidden), directions * weights * height))
        features = directions * hidden
    return counts + linear_counts(features, [num_classes])
