"""User models that misbehave, for the hostile specs beside this folder (family
``tests.specs.bad.usermods.nets:<function>``, imported from the repository's root)."""

import sys

import torch
from torch import nn

CONSTANT = 3


class Tiny(nn.Module):
    """A linear model; `mode` makes its forward misbehave."""

    def __init__(self, input_shape, num_classes, mode="ok"):
        super().__init__()
        channels, height, width = input_shape
        self.linear = nn.Linear(channels * height * width, num_classes)
        self.mode = mode

    def forward(self, x):
        if self.mode == "raises":
            return 1 / 0
        if self.mode == "exits":
            sys.exit(0)
        if self.mode == "interrupts":
            raise KeyboardInterrupt
        logits = self.linear(torch.flatten(x, 1))
        if self.mode == "wrong_shape":
            return logits[:, :3]
        if self.mode == "flattened":
            return logits.reshape(-1)
        if self.mode == "tuple":
            return logits, logits
        return logits


def tiny(input_shape, num_classes, mode="ok"):
    return Tiny(input_shape, num_classes, mode)


def raises(input_shape, num_classes):
    raise RuntimeError("no GPU in this process")


def raises_key(input_shape, num_classes, **params):
    return Tiny(input_shape, num_classes, params["mode"])


def exits(input_shape, num_classes):
    sys.exit(0)


def exits_with_message(input_shape, num_classes):
    sys.exit("config file not found")


def interrupts(input_shape, num_classes):
    raise KeyboardInterrupt


def returns_none(input_shape, num_classes):
    return None


def returns_class(input_shape, num_classes):
    return Tiny


def no_weights(input_shape, num_classes):
    return nn.Flatten()
