"""Multi-layer perceptron family on the flattened image."""

from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import nn

from fleet.engines._base import InputShape
from fleet.engines.torch.zoo._layers import SeededDropout


class MLP(nn.Module):
    """Flatten, then Linear-ReLU-dropout per entry of `hidden`, then a linear head."""

    def __init__(self, input_shape: InputShape, num_classes: int, hidden: Sequence[int], dropout: float):
        super().__init__()
        layers: list[nn.Module] = [nn.Flatten()]
        features = math.prod(input_shape)
        for width in hidden:
            layers += [nn.Linear(features, width), nn.ReLU(inplace=True), SeededDropout(dropout)]
            features = width
        layers.append(nn.Linear(features, num_classes))
        self.layers = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def build(input_shape: InputShape, num_classes: int, hidden: Sequence[int], dropout: float) -> MLP:
    """The family's builder, called with validated `MLPParams` fields."""
    return MLP(input_shape, num_classes, hidden, dropout)
