"""Building blocks shared by the model zoo: a seedable dropout and spatial-size arithmetic."""

from __future__ import annotations

import torch
from torch import nn


class SeededDropout(nn.Dropout):
    """`nn.Dropout` that draws its mask from a dedicated `torch.Generator` when one is set.

    The engine sets `generator` (see `set_dropout_generator`) so that a model's randomness
    does not touch, and is not touched by, torch's global RNG. Without a generator it falls
    back to the global RNG, like `nn.Dropout`.
    """

    def __init__(self, p: float = 0.5):
        super().__init__(p)
        self.generator: torch.Generator | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        if self.generator is None:
            return super().forward(x)
        keep = torch.empty_like(x).bernoulli_(1.0 - self.p, generator=self.generator)
        return x * keep / (1.0 - self.p)


def set_dropout_generator(model: nn.Module, generator: torch.Generator | None) -> int:
    """Point every `SeededDropout` of `model` at `generator`; returns how many there are."""
    layers = [m for m in model.modules() if isinstance(m, SeededDropout)]
    for layer in layers:
        layer.generator = generator
    return len(layers)


def halving_stride(height: int, width: int) -> tuple[int, int]:
    """Stride 2 along each dimension still wider than one pixel, else 1."""
    return (2 if height > 1 else 1, 2 if width > 1 else 1)


def strided_size(size: int, stride: int) -> int:
    """Output size of a 'same'-padded conv (kernel 1 or 3) with `stride`: ceil(size / stride)."""
    return -(-size // stride)


def pooled_size(size: int, kernel: int) -> int:
    """Output size of a pooling layer with kernel = stride = `kernel` and no padding."""
    return size // kernel


def init_weights(model: nn.Module) -> None:
    """He-normal convs, unit/zero batch norms, default-uniform linear layers with zero bias.
    Nothing on torch's meta device (a model built only to be counted): there a first normal_
    loads torch's compiler stack (dynamo, sympy), 1.2 s, for values that do not exist."""
    if any(p.is_meta for p in model.parameters()):
        return
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)
