"""Plain CNN family: conv-BN-ReLU layers, each followed by 2x2 max pooling while the map allows."""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from fleet.engines._base import InputShape
from fleet.engines.torch.zoo._layers import SeededDropout, init_weights, pooled_size


def conv_layer(cin: int, cout: int, kernel_size: int, height: int, width: int) -> tuple[nn.Sequential, int, int]:
    """conv(kernel, 'same')-BN-ReLU, then max pooling by 2 along each dimension of >= 2 pixels.

    Returns the layer and the map's new height and width.
    """
    layers: list[nn.Module] = [
        nn.Conv2d(cin, cout, kernel_size, padding=kernel_size // 2, bias=False),
        nn.BatchNorm2d(cout),
        nn.ReLU(inplace=True),
    ]
    kernel = (2 if height >= 2 else 1, 2 if width >= 2 else 1)
    if kernel != (1, 1):
        layers.append(nn.MaxPool2d(kernel))
    return nn.Sequential(*layers), pooled_size(height, kernel[0]), pooled_size(width, kernel[1])


def classifier(features: int, hidden: int, dropout: float, num_classes: int) -> nn.Sequential:
    """Linear head, preceded by a hidden Linear-ReLU-dropout layer when `hidden` > 0."""
    if hidden == 0:
        return nn.Sequential(nn.Linear(features, num_classes))
    return nn.Sequential(
        nn.Linear(features, hidden), nn.ReLU(inplace=True), SeededDropout(dropout), nn.Linear(hidden, num_classes)
    )


class CNN(nn.Module):
    """Conv layers, flatten, optional hidden layer, linear head."""

    def __init__(
        self,
        input_shape: InputShape,
        num_classes: int,
        channels: Sequence[int],
        hidden: int,
        kernel_size: int,
        dropout: float,
    ):
        super().__init__()
        cin, height, width = input_shape
        layers = []
        for cout in channels:
            layer, height, width = conv_layer(cin, cout, kernel_size, height, width)
            layers.append(layer)
            cin = cout
        self.features = nn.Sequential(*layers)
        self.classifier = classifier(cin * height * width, hidden, dropout, num_classes)
        init_weights(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.features(x), 1))


def build(
    input_shape: InputShape, num_classes: int, channels: Sequence[int], hidden: int, kernel_size: int, dropout: float
) -> CNN:
    """The family's builder, called with validated `CNNParams` fields."""
    return CNN(input_shape, num_classes, channels, hidden, kernel_size, dropout)
