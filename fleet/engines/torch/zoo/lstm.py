"""LSTM family: an image's rows are the time steps, a row's pixels x channels the features."""

from __future__ import annotations

import torch
from torch import nn

from fleet.engines._base import InputShape


def rows_as_steps(x: torch.Tensor) -> torch.Tensor:
    """(N, C, H, W) -> (N, H, W*C): one time step per row, pixel-major features."""
    n, c, h, w = x.shape
    return x.permute(0, 2, 3, 1).reshape(n, h, w * c)


class RowLSTM(nn.Module):
    """LSTM over the rows; the last time step's output feeds a linear head."""

    def __init__(self, input_shape: InputShape, num_classes: int, hidden: int, layers: int, bidirectional: bool):
        super().__init__()
        channels, _, width = input_shape
        self.lstm = nn.LSTM(
            width * channels, hidden, num_layers=layers, batch_first=True, bidirectional=bidirectional
        )
        self.head = nn.Linear(hidden * (2 if bidirectional else 1), num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(rows_as_steps(x))
        return self.head(out[:, -1, :])


def build(input_shape: InputShape, num_classes: int, hidden: int, layers: int, bidirectional: bool) -> RowLSTM:
    """The family's builder, called with validated `LSTMParams` fields."""
    return RowLSTM(input_shape, num_classes, hidden, layers, bidirectional)
