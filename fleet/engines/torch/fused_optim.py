"""`StackedUpdate`: the optimizer step of a fused bundle, over its members' stacked weights.

A bundle keeps each of its K members' parameters in one row of a ``(K, P)`` tensor (and the
gradients, momentum and Adam moments alike); this update is `ParamUpdate`'s (SGD with momentum
and weight decay, Adam, AdamW) done on the whole matrix at once, with every member's own
hyper-parameters as ``(K, 1)`` columns that broadcast over its row: a handful of operations per
step however many members and parameter tensors there are. The arithmetic is `ParamUpdate`'s
operation for operation (tests/test_fused_engine.py trains members beside the torch engine):

- SGD: ``g += wd * p``; ``buf = momentum * buf + g``; ``p -= lr * buf``. A member without a
  momentum buffer (fresh, or momentum 0) has a zero one, so its first step gives
  ``buf = g`` exactly, as `ParamUpdate`'s first step copies it.
- Adam / AdamW: `ParamUpdate`'s formulas, the bias corrections from each member's own step
  count (members may have joined the bundle at different steps).

A member's optimizer state goes in and out in torch.optim's `state_dict` layout (what the torch
engine checkpoints), so that a member taken out of a bundle is an ordinary model.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from fleet.engines.torch.optim import ADAM_BETAS, ADAM_EPS, SLOTS, ParamUpdate
from fleet.spec.sections import Optimizer, TrainSpec


def column(values: Sequence[float], device: torch.device) -> torch.Tensor:
    """Per-member values as a float32 ``(K, 1)`` column (rounded from Python's doubles, as a
    scalar argument of a torch operation is)."""
    return torch.tensor(list(values), dtype=torch.float32, device=device).reshape(-1, 1)


class StackedUpdate:
    """SGD, Adam or AdamW over a bundle's ``(K, P)`` parameter matrix, per-member settings.

    Args:
        kind: the optimizer every member uses.
        size: P, the parameters of one member.
        device: where the matrices live.
    """

    def __init__(self, kind: Optimizer, size: int, device: torch.device):
        self.kind, self.size, self.device = kind, size, device
        self.trains: list[TrainSpec] = []
        self.lrs: list[float] = []
        self.steps: list[int] = []  # optimizer steps per member (Adam's bias corrections)
        self.stepped: list[bool] = []  # whether the member's torch.optim state has slots yet
        self.slots = {name: torch.zeros((0, size), device=device) for name in SLOTS[kind]}
        self._hyper: dict[str, torch.Tensor] = {}

    # -- members ------------------------------------------------------------------------------

    def append(self, train: TrainSpec, lr: float, update: ParamUpdate) -> None:
        """Add a member: its settings, its first learning rate, and the optimizer state of its
        single-model optimizer `update` (slots and steps; none yet for a fresh one)."""
        if train.optimizer is not self.kind:
            raise ValueError(f"a {train.optimizer.value} member cannot join a bundle of {self.kind.value}")
        for name in self.slots:
            row = flat_row(update.slots.get(name), self.size, self.device)
            self.slots[name] = torch.cat([self.slots[name], row])
        self.trains.append(train)
        self.lrs.append(lr)
        self.steps.append(update.steps)
        self.stepped.append(bool(update.slots))
        self._hyper.clear()

    def remove(self, index: int) -> None:
        """Drop member `index` (the rows after it move up by one)."""
        keep = [k for k in range(len(self.trains)) if k != index]
        rows = torch.tensor(keep, dtype=torch.long, device=self.device)
        self.slots = {name: slot.index_select(0, rows) for name, slot in self.slots.items()}
        for values in (self.trains, self.lrs, self.steps, self.stepped):
            del values[index]
        self._hyper.clear()

    def set_lr(self, index: int, lr: float) -> None:
        """Member `index`'s learning rate from the next step on (its schedule's)."""
        self.lrs[index] = lr
        self._hyper.clear()

    def member_state(self, index: int, shapes: Sequence[torch.Size]) -> dict[str, Any]:
        """Member `index`'s optimizer state in `ParamUpdate.state_dict`'s layout, its parameter
        tensors of `shapes` (in order) cut out of its row, on the host."""
        single = ParamUpdate([torch.empty(shape) for shape in shapes], self.trains[index])
        single.lr, single.steps = self.lrs[index], self.steps[index]
        if self.stepped[index]:
            single.slots = {name: split_row(slot[index].cpu(), shapes) for name, slot in self.slots.items()}
        return single.state_dict()

    # -- the step -----------------------------------------------------------------------------

    @torch.no_grad()
    def step(self, params: torch.Tensor, grads: torch.Tensor) -> None:
        """One step of every member: `params` and `grads` are ``(K, P)``, a member per row."""
        self.steps = [steps + 1 for steps in self.steps]
        self.stepped = [stepped or self._keeps_slots(k) for k, stepped in enumerate(self.stepped)]
        if self.kind is Optimizer.SGD:
            self._sgd(params, grads)
        else:
            self._adam(params, grads)

    def _keeps_slots(self, index: int) -> bool:
        """Whether a step gives the member's single-model optimizer slots (SGD without momentum
        keeps none)."""
        return self.kind is not Optimizer.SGD or bool(self.trains[index].momentum)

    def _column(self, name: str) -> torch.Tensor:
        """A per-member setting as a ``(K, 1)`` column, cached until a member or an lr changes."""
        if name not in self._hyper:
            values = self.lrs if name == "lr" else [getattr(train, name) for train in self.trains]
            self._hyper[name] = column(values, self.device)
        return self._hyper[name]

    def _decayed(self, params: torch.Tensor, grads: torch.Tensor) -> torch.Tensor:
        """``g + wd * p`` (L2 weight decay added to the gradient), or `grads` when no member decays."""
        if not any(train.weight_decay for train in self.trains):
            return grads
        return torch.addcmul(grads, self._column("weight_decay"), params)

    def _sgd(self, params: torch.Tensor, grads: torch.Tensor) -> None:
        buffer = self.slots["momentum_buffer"]
        buffer.mul_(self._column("momentum")).add_(self._decayed(params, grads))
        params.addcmul_(-self._column("lr"), buffer)

    def _adam(self, params: torch.Tensor, grads: torch.Tensor) -> None:
        beta1, beta2 = ADAM_BETAS
        if self.kind is Optimizer.ADAMW:
            decay = [1 - lr * train.weight_decay for lr, train in zip(self.lrs, self.trains)]
            params.mul_(column(decay, self.device))
        else:
            grads = self._decayed(params, grads)
        exp_avg, exp_avg_sq = self.slots["exp_avg"], self.slots["exp_avg_sq"]
        exp_avg.lerp_(grads, 1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grads, grads, value=1 - beta2)
        step_size = column([-lr / (1 - beta1**steps) for lr, steps in zip(self.lrs, self.steps)], self.device)
        correction = column([(1 - beta2**steps) ** 0.5 for steps in self.steps], self.device)
        denom = exp_avg_sq.sqrt().div_(correction).add_(ADAM_EPS)
        params.addcdiv_(step_size * exp_avg, denom)


def flat_row(tensors: Sequence[torch.Tensor] | None, size: int, device: torch.device) -> torch.Tensor:
    """One member's per-tensor values as a ``(1, size)`` row (zeros where it has none yet)."""
    if not tensors:
        return torch.zeros((1, size), device=device)
    return torch.cat([t.detach().reshape(-1) for t in tensors]).to(device=device, dtype=torch.float32).reshape(1, -1)


def split_row(row: torch.Tensor, shapes: Sequence[torch.Size]) -> list[torch.Tensor]:
    """A 1-D row cut into new tensors of `shapes`, in order."""
    sizes = [torch.Size(shape).numel() for shape in shapes]
    return [piece.reshape(shape).clone() for piece, shape in zip(row.split(sizes), shapes)]
