"""Size and cost of a model: parameters, their bytes, forward FLOPs per sample (approximate).

FLOPs are 2 x multiply-adds of the layers that dominate: `Conv2d`, `Linear` and `LSTM`
(four gates per time step). Batch norm, activations, pooling, additions and concatenations
are neglected, as are biases. They are counted with forward hooks on one dummy sample,
so shapes that depend on the input (strides, pooling) are exact.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from fleet.engines._base import InputShape, ModelStats


def conv2d_macs(layer: nn.Conv2d, output: torch.Tensor) -> int:
    """Every output element costs (C_in / groups) x kernel area multiply-adds."""
    kh, kw = layer.kernel_size
    return output.numel() * (layer.in_channels // layer.groups) * kh * kw


def linear_macs(layer: nn.Linear, output: torch.Tensor) -> int:
    """Every output element costs `in_features` multiply-adds."""
    return output.numel() * layer.in_features


def lstm_step_macs(layer: nn.LSTM) -> int:
    """Multiply-adds of one time step for one sequence, over all layers and directions."""
    hidden = layer.hidden_size
    recurrent = layer.proj_size or hidden
    directions = 2 if layer.bidirectional else 1
    total = 0
    for k in range(layer.num_layers):
        inputs = layer.input_size if k == 0 else recurrent * directions
        per_direction = 4 * hidden * (inputs + recurrent) + (hidden * layer.proj_size)
        total += directions * per_direction
    return total


def lstm_macs(layer: nn.LSTM, inputs: tuple, output: object) -> int:
    """Time steps x sequences x per-step cost (padded `(N, T, F)` / `(T, N, F)` inputs only)."""
    x = inputs[0]
    if not isinstance(x, torch.Tensor):
        return 0
    if x.dim() == 2:
        sequences, steps = 1, x.shape[0]
    elif layer.batch_first:
        sequences, steps = x.shape[0], x.shape[1]
    else:
        steps, sequences = x.shape[0], x.shape[1]
    return steps * sequences * lstm_step_macs(layer)


def _macs_hook(counter: list[int]) -> Callable[[nn.Module, tuple, object], None]:
    def hook(module: nn.Module, inputs: tuple, output: object) -> None:
        if isinstance(module, nn.Conv2d):
            counter[0] += conv2d_macs(module, output)
        elif isinstance(module, nn.Linear):
            counter[0] += linear_macs(module, output)
        elif isinstance(module, nn.LSTM):
            counter[0] += lstm_macs(module, inputs, output)

    return hook


def forward_flops(model: nn.Module, input_shape: InputShape) -> int:
    """Approximate FLOPs of one forward pass on one sample (eval mode, no grad)."""
    counter = [0]
    counted = [m for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear, nn.LSTM))]
    handles = [m.register_forward_hook(_macs_hook(counter)) for m in counted]
    was_training = model.training
    try:
        model.eval()
        with torch.no_grad():
            model(torch.zeros((1, *input_shape)))
    finally:
        model.train(was_training)
        for handle in handles:
            handle.remove()
    return 2 * counter[0]


def model_stats(model: nn.Module, input_shape: InputShape) -> ModelStats:
    """Parameters, their bytes and forward FLOPs per sample of a model on the CPU."""
    params = list(model.parameters())
    return ModelStats(
        parameters=sum(p.numel() for p in params),
        param_bytes=sum(p.numel() * p.element_size() for p in params),
        flops_per_sample=forward_flops(model, input_shape),
    )
