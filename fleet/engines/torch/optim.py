"""`ParamUpdate`: the torch engine's optimizer step, SGD, Adam and AdamW.

The arithmetic is torch.optim's, operation for operation (tests/test_engine_parity.py trains
the engine beside `torch.optim` and compares the weights), and the checkpointed state has
torch.optim's `state_dict` layout, so checkpoints written while the engine used torch.optim
load. Why not torch.optim itself: its constructor and every `step()` import torch's compiler
(`torch._dynamo`, to mark the step as not compilable), 2.4 s of CPU before a trainer's first
batch, paid in every trainer process of every job, for a compiler the engine never uses.

Tensors are updated with torch's `_foreach_*` operations: on a GPU all at once, in few kernel
launches, as torch.optim does there; on a CPU in runs of consecutive tensors small enough to
stay in the cache through the update's operations, where they run the kernels of torch.optim's
tensor-by-tensor loop (bench/optim_step.py: 0.7-0.9x its step time).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from fleet.spec.sections import Optimizer, TrainSpec

ADAM_BETAS = (0.9, 0.999)
ADAM_EPS = 1e-8
CHUNK_ELEMENTS = 1 << 16  # values updated together on a CPU: 256 KiB per array, five arrays in the cache
SLOTS = {Optimizer.SGD: ("momentum_buffer",), Optimizer.ADAM: ("exp_avg", "exp_avg_sq"),
         Optimizer.ADAMW: ("exp_avg", "exp_avg_sq")}


def update_chunks(sizes: Sequence[int], one: bool, elements: int = CHUNK_ELEMENTS) -> list[tuple[int, int]]:
    """Index ranges of the tensors updated together: all at once (`one`: on a GPU, few kernel
    launches), else runs of consecutive tensors of up to `elements` values together (a large
    tensor alone), so that each run stays in the CPU's cache through the update's operations
    and small tensors share their calls."""
    if one:
        return [(0, len(sizes))]
    chunks, start, total = [], 0, 0
    for k, size in enumerate(sizes):
        if k > start and total + size > elements:
            chunks.append((start, k))
            start, total = k, 0
        total += size
    return chunks + [(start, len(sizes))] if sizes else chunks


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
        self._fresh = True
        self._chunks = update_chunks([p.numel() for p in self.params], self.params[0].device.type == "cuda")

    @torch.no_grad()
    def step(self) -> None:
        self.steps += 1
        self._fresh = not self.slots  # the first step: SGD's momentum buffer becomes its gradient
        if self._fresh and (self.kind is not Optimizer.SGD or self.momentum):
            self.slots = {name: [torch.zeros_like(p) for p in self.params] for name in SLOTS[self.kind]}
        update = self._sgd if self.kind is Optimizer.SGD else self._adam
        slots = [self.slots[name] for name in SLOTS[self.kind] if name in self.slots]
        grads = [p.grad for p in self.params]
        for a, b in self._chunks:
            update(self.params[a:b], grads[a:b], *(slot[a:b] for slot in slots))

    def _sgd(self, params: list[torch.Tensor], grads: list[torch.Tensor], buffers: list[torch.Tensor] = ()) -> None:
        if self.weight_decay:
            grads = torch._foreach_add(grads, params, alpha=self.weight_decay)
        if buffers:
            if self._fresh:
                torch._foreach_copy_(buffers, grads)
            else:
                torch._foreach_mul_(buffers, self.momentum)
                torch._foreach_add_(buffers, grads)
            grads = buffers
        torch._foreach_add_(params, grads, alpha=-self.lr)

    def _adam(self, params: list[torch.Tensor], grads: list[torch.Tensor], exp_avg: list[torch.Tensor],
              exp_avg_sq: list[torch.Tensor]) -> None:
        beta1, beta2 = ADAM_BETAS
        if self.weight_decay and self.kind is Optimizer.ADAMW:
            torch._foreach_mul_(params, 1 - self.lr * self.weight_decay)
        elif self.weight_decay:
            grads = torch._foreach_add(grads, params, alpha=self.weight_decay)
        torch._foreach_lerp_(exp_avg, grads, 1 - beta1)
        torch._foreach_mul_(exp_avg_sq, beta2)
        torch._foreach_addcmul_(exp_avg_sq, grads, grads, value=1 - beta2)
        step_size = self.lr / (1 - beta1**self.steps)
        denom = torch._foreach_sqrt(exp_avg_sq)
        torch._foreach_div_(denom, (1 - beta2**self.steps) ** 0.5)
        torch._foreach_add_(denom, ADAM_EPS)
        torch._foreach_addcdiv_(params, exp_avg, denom, value=-step_size)

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
