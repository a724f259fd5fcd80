"""The tensorflow engine's optimizers, on flat float32 host arrays, with torch's semantics.

Each update is written out (a few lines) instead of using Keras optimizers, so that SGD, Adam
and AdamW do exactly what `torch.optim` does with the spec's settings and their state is a
few plain arrays for checkpoints:

* ``sgd``: ``d = g + wd * p``; with momentum ``buf = d`` on the first step, then
  ``buf = momentum * buf + d`` (no dampening, no Nesterov); ``p -= lr * buf``.
* ``adam``: ``g += wd * p`` (L2, as `torch.optim.Adam`), then Adam with betas (0.9, 0.999),
  eps 1e-8 and bias correction.
* ``adamw``: ``p *= 1 - lr * wd`` (decoupled, as `torch.optim.AdamW`), then Adam on ``g``.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from fleet.spec.sections import Optimizer, TrainSpec

BETAS = (0.9, 0.999)
EPS = 1e-8
F32 = np.float32


def _sgd(opt: "FlatOptimizer", p: np.ndarray, g: np.ndarray, lr: float) -> None:
    d = opt.scratch(p, 0)
    np.multiply(p, F32(opt.weight_decay), out=d) if opt.weight_decay else d.fill(0)
    d += g  # d = g + wd * p
    if opt.momentum:
        if opt.step_count == 1:
            opt.slots["momentum"] = d.copy()
        else:
            buf = opt.slots["momentum"]
            buf *= F32(opt.momentum)
            buf += d
        d = opt.slots["momentum"]
    step = opt.scratch(p, 1)
    np.multiply(d, F32(lr), out=step)
    p -= step


def _adam_update(opt: "FlatOptimizer", p: np.ndarray, g: np.ndarray, lr: float) -> None:
    """The Adam step shared by ``adam`` and ``adamw`` (torch's formulation)."""
    b1, b2 = BETAS
    m, v = opt.slots.setdefault("exp_avg", np.zeros_like(p)), opt.slots.setdefault("exp_avg_sq", np.zeros_like(p))
    work = opt.scratch(p, 1)
    np.subtract(g, m, out=work)
    work *= F32(1 - b1)
    m += work  # torch: exp_avg.lerp_(grad, 1 - beta1)
    v *= F32(b2)
    np.multiply(g, F32(1 - b2), out=work)
    work *= g
    v += work
    t = opt.step_count
    bias1, bias2 = 1 - b1**t, 1 - b2**t
    np.sqrt(v, out=work)
    work /= F32(np.sqrt(bias2))
    work += F32(EPS)  # the denominator
    np.divide(m, work, out=work)
    work *= F32(lr / bias1)
    p -= work


def _adam(opt: "FlatOptimizer", p: np.ndarray, g: np.ndarray, lr: float) -> None:
    if opt.weight_decay:
        decayed = opt.scratch(p, 0)
        np.multiply(p, F32(opt.weight_decay), out=decayed)
        decayed += g
        g = decayed
    _adam_update(opt, p, g, lr)


def _adamw(opt: "FlatOptimizer", p: np.ndarray, g: np.ndarray, lr: float) -> None:
    p *= F32(1 - lr * opt.weight_decay)
    _adam_update(opt, p, g, lr)


UPDATES: dict[Optimizer, Callable[["FlatOptimizer", np.ndarray, np.ndarray, float], None]] = {
    Optimizer.SGD: _sgd,
    Optimizer.ADAM: _adam,
    Optimizer.ADAMW: _adamw,
}


class FlatOptimizer:
    """One of `UPDATES` over all parameters as one flat float32 array.

    Args:
        train: the model's training section (optimizer, momentum, weight decay).
    """

    def __init__(self, train: TrainSpec):
        self.kind = train.optimizer
        self.momentum, self.weight_decay = float(train.momentum), float(train.weight_decay)
        self.step_count = 0
        self.slots: dict[str, np.ndarray] = {}
        self._scratch: list[np.ndarray] = []  # work arrays, so that a step allocates nothing

    def scratch(self, like: np.ndarray, index: int) -> np.ndarray:
        """Work array `index` (0 or 1) of `like`'s size; its contents are the caller's to set."""
        if not self._scratch or self._scratch[0].shape != like.shape:
            self._scratch = [np.empty_like(like), np.empty_like(like)]
        return self._scratch[index]

    def step(self, params: np.ndarray, grads: np.ndarray, lr: float) -> None:
        """Update `params` in place from `grads` at learning rate `lr`."""
        self.step_count += 1
        UPDATES[self.kind](self, params, grads, lr)

    def state(self) -> dict[str, Any]:
        return {"kind": self.kind.value, "step": self.step_count, "slots": {k: v.copy() for k, v in self.slots.items()}}

    def load_state(self, state: dict[str, Any], size: int) -> None:
        """Restore `state()`; raises ValueError when it is another optimizer's or size's."""
        slots = state["slots"]
        if state["kind"] != self.kind.value or any(np.shape(v) != (size,) for v in slots.values()):
            raise ValueError(f"optimizer state of {state['kind']!r} does not fit {self.kind.value!r} "
                             f"over {size} parameters")
        self.step_count = int(state["step"])
        self.slots = {k: np.array(v, dtype=np.float32) for k, v in slots.items()}
