"""A fused bundle's weights and its vectorised network: the K members' parameters stacked into
one matrix, their buffers stacked per name, and the forward pass `torch.func.vmap` runs over them.

`StackedWeights` keeps member k's parameters in row k of a ``(K, P)`` matrix (what the optimizer
steps at once, `StackedUpdate`); each parameter tensor of the network is a ``(K, *shape)`` view
of it, an autograd leaf whose ``.grad`` is the same view of a ``(K, P)`` gradient matrix, so a
backward pass writes all members' gradients in place. Buffers (batch norm's running statistics
and counters) are ``(K, *shape)`` tensors that batch norm updates in place under ``vmap``: each
member keeps its own running statistics.

`StackedNet` is the network as ``torch.func.functional_call`` sees it: a copy of one member's
module on torch's meta device (it holds no values: every call is given the stacked ones), its
dropout layers replaced by `MaskedDropout`, whose masks the caller draws from each member's own
generator before the vectorised call (`vmap` would draw every member's mask from one
generator; drawn apart, member k's masks are the ones its own engine would draw).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence

import torch
from torch import nn
from torch.func import functional_call, stack_module_state, vmap

from fleet.engines.torch.zoo import SeededDropout


class StackedWeights:
    """The parameters and buffers of K members of one architecture, a member per row.

    Args:
        template: a module of the architecture (its names and shapes are taken, not its values).
        device: where the stacked tensors live.
    """

    def __init__(self, template: nn.Module, device: torch.device):
        self.device = device
        self.names = [name for name, _ in template.named_parameters()]
        self.shapes = [param.shape for _, param in template.named_parameters()]
        self.sizes = [param.numel() for _, param in template.named_parameters()]
        self.state_keys = list(template.state_dict())
        self.params = torch.zeros((0, sum(self.sizes)), device=device)
        self.grads = torch.zeros_like(self.params)
        self.buffers = {name: torch.zeros((0, *b.shape), dtype=b.dtype, device=device)
                        for name, b in template.named_buffers()}
        self.leaves: dict[str, torch.Tensor] = {}
        self._bind()

    @property
    def count(self) -> int:
        """K, the members stacked."""
        return self.params.shape[0]

    def extend(self, nets: Sequence[nn.Module]) -> None:
        """Stack the weights of `nets` (modules of the architecture) below the present rows."""
        stacked_params, stacked_buffers = stack_module_state(list(nets))
        rows = torch.cat([stacked_params[name].detach().reshape(len(nets), -1) for name in self.names], dim=1)
        self.params = torch.cat([self.params, rows.to(self.device, torch.float32)])
        for name, buffer in stacked_buffers.items():
            self.buffers[name] = torch.cat([self.buffers[name], buffer.to(self.device)])
        self._bind()

    def remove(self, index: int) -> None:
        """Drop member `index`'s row (the rows after it move up by one)."""
        keep = torch.tensor([k for k in range(self.count) if k != index], dtype=torch.long, device=self.device)
        self.params = self.params.index_select(0, keep)
        self.buffers = {name: buffer.index_select(0, keep) for name, buffer in self.buffers.items()}
        self._bind()

    def member_state_dict(self, index: int) -> dict[str, torch.Tensor]:
        """Member `index`'s weights as its own module's `state_dict` (new host tensors)."""
        found = {name: leaf[index] for name, leaf in self.leaves.items()}
        found.update((name, buffer[index]) for name, buffer in self.buffers.items())
        return {key: found[key].detach().to("cpu", copy=True) for key in self.state_keys}

    def member_row(self, index: int) -> torch.Tensor:
        """Member `index`'s parameters, flat, in parameter order (a view of its row)."""
        return self.params[index]

    def _bind(self) -> None:
        """New leaves over the parameter matrix, their gradients views of a zeroed matrix."""
        self.grads = torch.zeros_like(self.params)
        self.leaves, offset = {}, 0
        for name, shape, size in zip(self.names, self.shapes, self.sizes):
            leaf = nn.Parameter(self.params[:, offset:offset + size].view(self.count, *shape))
            leaf.grad = self.grads[:, offset:offset + size].view(self.count, *shape)
            self.leaves[name] = leaf
            offset += size


class MaskedDropout(nn.Module):
    """Dropout whose keep-mask (0/1 floats, the shape of its input) is set before each call."""

    def __init__(self, p: float):
        super().__init__()
        self.p = p
        self.mask: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        return x * self.mask / (1.0 - self.p)


def dropout_features(net: nn.Module, input_shape: tuple[int, ...]) -> dict[str, tuple[float, tuple[int, ...]]]:
    """Each active `SeededDropout` of `net` (by name, in call order): its p and the shape of one
    sample of its input, found by one forward pass of a zero sample in eval mode (nothing changes)."""
    found: dict[str, tuple[float, tuple[int, ...]]] = {}

    def record(name: str, p: float, args: tuple) -> None:
        found.setdefault(name, (p, tuple(args[0].shape[1:])))

    hooks = [layer.register_forward_pre_hook(lambda _, args, name=name, p=layer.p: record(name, p, args))
             for name, layer in net.named_modules() if isinstance(layer, SeededDropout) and layer.p > 0]
    was_training = net.training
    net.eval()
    try:
        with torch.no_grad():
            net(torch.zeros((1, *input_shape)))
    finally:
        net.train(was_training)
        for hook in hooks:
            hook.remove()
    return found


class StackedNet:
    """The network of a bundle, called on stacked weights for all members at once.

    Args:
        net: one member's module (copied; the copy's values are dropped).
        input_shape: ``(C, H, W)`` of one sample.
    """

    def __init__(self, net: nn.Module, input_shape: tuple[int, ...]):
        self.dropouts = dropout_features(net, input_shape)
        self.module = copy.deepcopy(net)
        for name, (p, _) in self.dropouts.items():
            parent, _, attr = name.rpartition(".")
            setattr(self.module.get_submodule(parent), attr, MaskedDropout(p))
        for layer in self.module.modules():
            if isinstance(layer, nn.ReLU):
                layer.inplace = False  # in place on a batched view, its backward copies the whole map
        self.module.to("meta")

    def draw_masks(self, generators: Sequence[torch.Generator], batch: int,
                   device: torch.device) -> dict[str, torch.Tensor]:
        """Every dropout layer's keep-masks for a batch of `batch`, stacked ``(K, batch, ...)``:
        member k's drawn from `generators[k]` as its own `SeededDropout` draws them."""
        return {name: torch.stack([torch.empty((batch, *shape), device=device).bernoulli_(1.0 - p, generator=g)
                                   for g in generators])
                for name, (p, shape) in self.dropouts.items()}

    def logits(self, weights: StackedWeights, masks: Mapping[str, torch.Tensor], x: torch.Tensor,
               training: bool) -> torch.Tensor:
        """``(K, N, classes)`` logits of every member on the shared batch `x` (train or eval mode)."""
        self.module.train(training)
        call = vmap(self._call, in_dims=(0, 0, 0, None), randomness="error")
        return call(weights.leaves, weights.buffers, dict(masks), x)

    def _call(self, params: dict, buffers: dict, masks: dict, x: torch.Tensor) -> torch.Tensor:
        """One member's forward (under vmap): its masks set on the dropout layers for the call."""
        layers = {name: self.module.get_submodule(name) for name in masks}
        for name, layer in layers.items():
            layer.mask = masks[name]
        try:
            return functional_call(self.module, (params, buffers), (x,))
        finally:
            for layer in layers.values():
                layer.mask = None
