"""ResNet-like family for small images: a 3x3 stem, four stages of residual blocks, a linear head.

Stage k has `blocks[k]` blocks of width ``width * 2**k`` (times 4 at a bottleneck's output);
stages 2-4 halve the map along each dimension that is still wider than one pixel.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from fleet.engines._base import InputShape
from fleet.engines.torch.zoo._layers import halving_stride, init_weights, strided_size

STAGE_MULTIPLIERS = (1, 2, 4, 8)
STAGE_HALVES = (False, True, True, True)
BOTTLENECK_EXPANSION = 4


def conv_bn(cin: int, cout: int, kernel: int, stride: tuple[int, int] = (1, 1)) -> nn.Sequential:
    """conv(kernel, 'same' padding, no bias) followed by batch norm."""
    conv = nn.Conv2d(cin, cout, kernel, stride=stride, padding=kernel // 2, bias=False)
    return nn.Sequential(conv, nn.BatchNorm2d(cout))


def shortcut(cin: int, cout: int, stride: tuple[int, int]) -> nn.Module:
    """Identity when shapes agree, else a strided 1x1 projection with batch norm."""
    if cin == cout and stride == (1, 1):
        return nn.Identity()
    return conv_bn(cin, cout, 1, stride)


class BasicBlock(nn.Module):
    """conv3x3-BN-ReLU-conv3x3-BN plus shortcut, then ReLU."""

    expansion = 1

    def __init__(self, cin: int, width: int, stride: tuple[int, int]):
        super().__init__()
        self.body = nn.Sequential(conv_bn(cin, width, 3, stride), nn.ReLU(inplace=True), conv_bn(width, width, 3))
        self.shortcut = shortcut(cin, width, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.shortcut(x))


class Bottleneck(nn.Module):
    """conv1x1-BN-ReLU-conv3x3(stride)-BN-ReLU-conv1x1(4x width)-BN plus shortcut, then ReLU."""

    expansion = BOTTLENECK_EXPANSION

    def __init__(self, cin: int, width: int, stride: tuple[int, int]):
        super().__init__()
        cout = width * self.expansion
        self.body = nn.Sequential(
            conv_bn(cin, width, 1),
            nn.ReLU(inplace=True),
            conv_bn(width, width, 3, stride),
            nn.ReLU(inplace=True),
            conv_bn(width, cout, 1),
        )
        self.shortcut = shortcut(cin, cout, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.shortcut(x))


def make_stage(
    block: type[BasicBlock] | type[Bottleneck], cin: int, width: int, count: int, stride: tuple[int, int]
) -> tuple[nn.Sequential, int]:
    """`count` blocks, the first one strided; returns the stage and its output channels."""
    layers = []
    for i in range(count):
        layers.append(block(cin, width, stride if i == 0 else (1, 1)))
        cin = width * block.expansion
    return nn.Sequential(*layers), cin


class ResNet(nn.Module):
    """Stem conv3x3(width)-BN-ReLU, four residual stages, global average pool, linear head."""

    def __init__(self, input_shape: InputShape, num_classes: int, blocks: Sequence[int], width: int, bottleneck: bool):
        super().__init__()
        channels, height, w = input_shape
        block = Bottleneck if bottleneck else BasicBlock
        self.stem = nn.Sequential(conv_bn(channels, width, 3), nn.ReLU(inplace=True))
        stages, cin = [], width
        for count, multiplier, halves in zip(blocks, STAGE_MULTIPLIERS, STAGE_HALVES):
            stride = halving_stride(height, w) if halves else (1, 1)
            stage, cin = make_stage(block, cin, width * multiplier, count, stride)
            stages.append(stage)
            height, w = strided_size(height, stride[0]), strided_size(w, stride[1])
        self.stages = nn.Sequential(*stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(cin, num_classes)
        init_weights(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stages(self.stem(x))
        return self.head(torch.flatten(self.pool(x), 1))


def build(input_shape: InputShape, num_classes: int, blocks: Sequence[int], width: int, bottleneck: bool) -> ResNet:
    """The family's builder, called with validated `ResNetParams` fields."""
    return ResNet(input_shape, num_classes, blocks, width, bottleneck)
