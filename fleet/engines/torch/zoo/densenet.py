"""DenseNet-BC-like family: a 3x3 stem, dense blocks of bottleneck layers, compressing transitions.

A transition halves the map (2x2 average pooling) along each dimension still wider than one
pixel, and skips the pooling altogether once the map is a single pixel.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import nn

from fleet.engines._base import InputShape
from fleet.engines.torch.zoo._layers import init_weights, pooled_size


def bn_relu_conv(cin: int, cout: int, kernel: int) -> list[nn.Module]:
    """BN-ReLU-conv(kernel, 'same' padding, no bias), as a list to splice into a Sequential."""
    conv = nn.Conv2d(cin, cout, kernel, padding=kernel // 2, bias=False)
    return [nn.BatchNorm2d(cin), nn.ReLU(inplace=True), conv]


class DenseLayer(nn.Module):
    """BN-ReLU-conv1x1(bn_size*growth)-BN-ReLU-conv3x3(growth); output concatenated to the input."""

    def __init__(self, cin: int, growth_rate: int, bn_size: int):
        super().__init__()
        inner = bn_size * growth_rate
        self.body = nn.Sequential(*bn_relu_conv(cin, inner, 1), *bn_relu_conv(inner, growth_rate, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x, self.body(x)], dim=1)


def dense_block(cin: int, layers: int, growth_rate: int, bn_size: int) -> tuple[nn.Sequential, int]:
    """`layers` dense layers; returns the block and its output channels."""
    block = nn.Sequential(*(DenseLayer(cin + i * growth_rate, growth_rate, bn_size) for i in range(layers)))
    return block, cin + layers * growth_rate


def transition(cin: int, compression: float, height: int, width: int) -> tuple[nn.Sequential, int, int, int]:
    """BN-ReLU-conv1x1 to floor(compression*cin) channels, then 2x2 average pooling where possible.

    Returns the transition, its output channels, and the map's new height and width.
    """
    cout = max(1, math.floor(compression * cin))
    layers = bn_relu_conv(cin, cout, 1)
    kernel = (2 if height > 1 else 1, 2 if width > 1 else 1)
    if kernel != (1, 1):
        layers.append(nn.AvgPool2d(kernel))
    return nn.Sequential(*layers), cout, pooled_size(height, kernel[0]), pooled_size(width, kernel[1])


class DenseNet(nn.Module):
    """Stem conv3x3, dense blocks with transitions between them, BN-ReLU-global pool-linear head."""

    def __init__(
        self,
        input_shape: InputShape,
        num_classes: int,
        blocks: Sequence[int],
        growth_rate: int,
        init_features: int,
        bn_size: int,
        compression: float,
    ):
        super().__init__()
        channels, height, width = input_shape
        layers: list[nn.Module] = [nn.Conv2d(channels, init_features, 3, padding=1, bias=False)]
        cin = init_features
        for k, count in enumerate(blocks):
            block, cin = dense_block(cin, count, growth_rate, bn_size)
            layers.append(block)
            if k < len(blocks) - 1:
                trans, cin, height, width = transition(cin, compression, height, width)
                layers.append(trans)
        layers += [nn.BatchNorm2d(cin), nn.ReLU(inplace=True), nn.AdaptiveAvgPool2d(1)]
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(cin, num_classes)
        init_weights(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(self.features(x), 1))


def build(
    input_shape: InputShape,
    num_classes: int,
    blocks: Sequence[int],
    growth_rate: int,
    init_features: int | None,
    bn_size: int,
    compression: float,
) -> DenseNet:
    """The family's builder, called with validated `DenseNetParams` fields (init_features None: 2*growth)."""
    stem = init_features if init_features is not None else 2 * growth_rate
    return DenseNet(input_shape, num_classes, blocks, growth_rate, stem, bn_size, compression)
