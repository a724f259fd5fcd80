"""`ParamUpdate`: the torch engine's optimizer step, SGD, Adam and AdamW.

The arithmetic is torch.optim's, operation for operation (tests/test_engine_parity.py trains
the engine beside `torch.optim` and compares the weights), and the checkpointed state has
torch.optim's `state_dict` layout, so checkpoints written while the engine used torch.optim
load. Why not torch.optim itself: its constructor and every `step()` import torch's compiler
(`torch._dynamo`, to mark the step as not compilable), 2.4 s of CPU before a trainer's first
batch, paid in every trainer process of every job, for a compiler the engine never uses.

Tensors are updated with torch's `_foreach_*` operations, which on the CPU run the same
kernels tensor by tensor and on a GPU fuse them into few launches, as torch.optim does there.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from fleet.spec.sections import Optimizer, TrainSpec

ADAM_BETAS = (0.9, 0.999)
ADAM_EPS = 1e-8
SLOTS = {Optimizer.SGD: ("momentum_buffer",), Optimizer.ADAM: ("exp_avg", "exp_avg_sq"),
         Optimizer.ADAMW: ("exp_avg", "exp_avg_sq")}


class ParamUpdate:
    """SGD (momentum, weight decay, no Nesterov, no dampening), Adam (L2 weight decay added to
    the gradient) or AdamW (decoupled weight decay) over `params`, whose `.grad` hold the
    gradients; `lr` is set by the engine's schedule before a step."""

    def __init__(self, params: Sequence[torch.nn.Parameter], train: TrainSpec):
        self.params = list(params)
        self.kind = train.optimizer
        self.lr = float(train.lr)
        self.momentum = float(train.momentum)
        self.weight_decay = float(train.weight_decay)
        self.steps = 0  # steps taken (Adam's bias correction counts them)
        self.slots: dict[str, list[torch.Tensor]] = {}  # created by the first step, as torch.optim's

    @torch.no_grad()
    def step(self) -> None:
        grads = [p.grad for p in self.params]
        self.steps += 1
        if self.kind is Optimizer.SGD:
            self._sgd(grads)
        else:
            self._adam(grads)

    def _sgd(self, grads: list[torch.Tensor]) -> None:
        if self.weight_decay:
            grads = torch._foreach_add(grads, self.params, alpha=self.weight_decay)
        if self.momentum:
            buffers = self.slots.get("momentum_buffer")
            if buffers is None:
                buffers = self.slots["momentum_buffer"] = [g.detach().clone() for g in grads]
            else:
                torch._foreach_mul_(buffers, self.momentum)
                torch._foreach_add_(buffers, grads)
            grads = buffers
        torch._foreach_add_(self.params, grads, alpha=-self.lr)

    def _adam(self, grads: list[torch.Tensor]) -> None:
        beta1, beta2 = ADAM_BETAS
        if "exp_avg" not in self.slots:
            self.slots = {name: [torch.zeros_like(p) for p in self.params] for name in SLOTS[self.kind]}
        exp_avg, exp_avg_sq = self.slots["exp_avg"], self.slots["exp_avg_sq"]
        if self.weight_decay and self.kind is Optimizer.ADAMW:
            torch._foreach_mul_(self.params, 1 - self.lr * self.weight_decay)
        elif self.weight_decay:
            grads = torch._foreach_add(grads, self.params, alpha=self.weight_decay)
        torch._foreach_lerp_(exp_avg, grads, 1 - beta1)
        torch._foreach_mul_(exp_avg_sq, beta2)
        torch._foreach_addcmul_(exp_avg_sq, grads, grads, value=1 - beta2)
        step_size = self.lr / (1 - beta1**self.steps)
        denom = torch._foreach_sqrt(exp_avg_sq)
        torch._foreach_div_(denom, (1 - beta2**self.steps) ** 0.5)
        torch._foreach_add_(denom, ADAM_EPS)
        torch._foreach_addcdiv_(self.params, exp_avg, denom, value=-step_size)

    # -- checkpoints: torch.optim's state_dict layout ---------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        state: dict[int, dict[str, Any]] = {}
        for name, tensors in self.slots.items():
            for index, tensor in enumerate(tensors):
                state.setdefault(index, {})[name] = tensor
        if self.kind is not Optimizer.SGD:
            for entry in state.values():
                entry["step"] = torch.tensor(float(self.steps))
        group = {"lr": self.lr, "momentum": self.momentum, "weight_decay": self.weight_decay,
                 "params": list(range(len(self.params)))}
        return {"state": state, "param_groups": [group]}

    def load_state_dict(self, saved: Mapping[str, Any]) -> None:
        """Load a `state_dict` of this class or of the torch.optim optimizer of the same kind.

        Raises:
            ValueError: the state is for another number or shape of parameters, or another optimizer.
        """
        groups, state = saved["param_groups"], saved["state"]
        tensors = sum(len(group["params"]) for group in groups)
        if tensors != len(self.params):
            raise ValueError(f"the optimizer state is for {tensors} parameter tensors, the network has {len(self.params)}")
        names = SLOTS[self.kind]
        foreign = {key for entry in state.values() for key, value in entry.items() if value is not None} - {*names, "step"}
        if foreign:
            raise ValueError(f"the optimizer state holds {', '.join(sorted(foreign))}: another optimizer's state "
                             f"than {self.kind.value}'s")
        stepped = [index for index, entry in state.items() if any(entry.get(name) is not None for name in names)]
        if not stepped:  # no step taken yet, or SGD without momentum
            self.slots, self.steps = {}, 0
            return
        if sorted(stepped) != list(range(len(self.params))):
            raise ValueError("the optimizer state covers only some of the network's parameter tensors")
        slots: dict[str, list[torch.Tensor]] = {name: [] for name in names}
        for index, param in enumerate(self.params):
            for name in names:
                tensor = state[index].get(name)
                if not isinstance(tensor, torch.Tensor) or tensor.shape != param.shape:
                    raise ValueError(f"the optimizer state's {name!r} of parameter tensor {index} does not fit its "
                                     f"shape {tuple(param.shape)} (another optimizer's state?)")
                slots[name].append(tensor.to(device=param.device, dtype=param.dtype, copy=True))
        self.slots = slots
        self.steps = int(float(state[0].get("step", 0)))
