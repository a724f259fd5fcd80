"""The tensorflow engine's optimizers, in the graph, with torch's semantics.

Each update is written out (a few lines) instead of using Keras optimizers, so that SGD, Adam
and AdamW do exactly what `torch.optim` does with the spec's settings:

* ``sgd``: ``d = g + wd * p``; with momentum ``buf = momentum * buf + d`` (``buf`` starts at
  zero, so it is ``d`` on the first step, as torch's; no dampening, no Nesterov);
  ``p -= lr * buf``.
* ``adam``: ``g += wd * p`` (L2, as `torch.optim.Adam`), then Adam with betas (0.9, 0.999),
  eps 1e-8 and bias correction.
* ``adamw``: ``p *= 1 - lr * wd`` (decoupled, as `torch.optim.AdamW`), then Adam on ``g``.

The slots (momentum, Adam's moments) and the step count are TF variables beside the
parameters; the learning rate is one too, so a schedule's new rate retraces nothing. The
scalars torch computes in Python (``lr / (1 - beta1 ** t)``, ``1 - lr * wd``) are computed in
float64 here as well. One update is one compiled call over all parameters; SGD's per-tensor
work is TF's fused kernels (``ResourceApplyMomentum``: one pass over a parameter and its
slot, torch's formula).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

import numpy as np
import tensorflow as tf

from fleet.engines.tensorflow.flat import FlatAssigner, flatten
from fleet.spec.sections import Optimizer, TrainSpec

BETAS = (0.9, 0.999)
EPS = 1e-8
ADAM_SLOTS = ("exp_avg", "exp_avg_sq")


def decayed(opt: "GraphOptimizer", p: tf.Variable, g: tf.Tensor) -> tf.Tensor:
    """``g + wd * p`` (torch's L2 weight decay), or `g` without decay."""
    return g + tf.cast(opt.weight_decay, g.dtype) * p if opt.weight_decay else g


def _sgd(opt: "GraphOptimizer", grads: Sequence[tf.Tensor]) -> None:
    for i, (p, g) in enumerate(zip(opt.params, grads)):
        d, lr = decayed(opt, p, g), tf.cast(opt.lr, p.dtype)
        if opt.momentum:  # buf = momentum * buf + d; p -= lr * buf
            momentum = tf.cast(opt.momentum, p.dtype)
            tf.raw_ops.ResourceApplyMomentum(var=p.handle, accum=opt.slots["momentum"][i].handle, lr=lr, grad=d,
                                             momentum=momentum)
        else:
            tf.raw_ops.ResourceApplyGradientDescent(var=p.handle, alpha=lr, delta=d)


def _adam_update(opt: "GraphOptimizer", grads: Sequence[tf.Tensor]) -> None:
    """The Adam step shared by ``adam`` and ``adamw``, in torch's order of operations (TF's
    fused kernel corrects the bias elsewhere and rounds ``1 - beta2`` otherwise)."""
    b1, b2 = BETAS
    t = tf.cast(opt.step, tf.float64)
    step_size, bias2_sqrt = opt.lr / (1 - b1**t), tf.sqrt(1 - b2**t)
    for p, g, m, v in zip(opt.params, grads, *(opt.slots[name] for name in ADAM_SLOTS)):
        scalar = functools.partial(tf.cast, dtype=p.dtype)
        exp_avg = m + (g - m) * scalar(1 - b1)  # torch: exp_avg.lerp_(grad, 1 - beta1)
        exp_avg_sq = v * scalar(b2) + g * scalar(1 - b2) * g
        m.assign(exp_avg)
        v.assign(exp_avg_sq)
        p.assign(p - exp_avg / (tf.sqrt(exp_avg_sq) / scalar(bias2_sqrt) + scalar(EPS)) * scalar(step_size))


def _adam(opt: "GraphOptimizer", grads: Sequence[tf.Tensor]) -> None:
    _adam_update(opt, [decayed(opt, p, g) for p, g in zip(opt.params, grads)])


def _adamw(opt: "GraphOptimizer", grads: Sequence[tf.Tensor]) -> None:
    for p in opt.params:
        p.assign(p * tf.cast(1 - opt.lr * opt.weight_decay, p.dtype))
    _adam_update(opt, grads)


UPDATES: dict[Optimizer, Callable[["GraphOptimizer", Sequence[tf.Tensor]], None]] = {
    Optimizer.SGD: _sgd,
    Optimizer.ADAM: _adam,
    Optimizer.ADAMW: _adamw,
}


def slot_names(kind: Optimizer, momentum: float) -> tuple[str, ...]:
    if kind is Optimizer.SGD:
        return ("momentum",) if momentum else ()
    return ADAM_SLOTS


class GraphOptimizer:
    """One of `UPDATES` over a model's trainable variables, its state in TF variables beside them.

    Args:
        train: the model's training section (optimizer, momentum, weight decay).
        params: the variables it updates, in the order of the flat gradients.
    """

    def __init__(self, train: TrainSpec, params: Sequence[tf.Variable]):
        self.kind = train.optimizer
        self.momentum, self.weight_decay = float(train.momentum), float(train.weight_decay)
        self.params = list(params)
        self.sizes = [int(np.prod(p.shape)) for p in self.params]
        self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="optimizer_step")
        self.lr = tf.Variable(0.0, dtype=tf.float64, trainable=False, name="learning_rate")
        self.slots = {name: [tf.Variable(tf.zeros(p.shape, p.dtype), trainable=False) for p in self.params]
                      for name in slot_names(self.kind, self.momentum)}
        self._assign_slots = {name: FlatAssigner(variables) for name, variables in self.slots.items()}
        flat = [tf.TensorSpec((sum(self.sizes),), tf.float32)]
        self._apply = tf.function(self.update)
        self._apply_flat = tf.function(self._update_flat, input_signature=flat)

    @property
    def step_count(self) -> int:
        return int(self.step.numpy())

    @property
    def traces(self) -> int:
        """How often its compiled updates were traced (once each, whatever the learning rate)."""
        return sum(f.experimental_get_tracing_count() for f in (self._apply, self._apply_flat))

    def set_lr(self, lr: float) -> None:
        self.lr.assign(lr)

    def apply(self, grads: Sequence[tf.Tensor]) -> None:
        """One step from one gradient tensor per parameter."""
        self._apply(list(grads))

    def apply_flat(self, flat: np.ndarray) -> None:
        """One step from the gradients of all parameters in one float32 host array."""
        self._apply_flat(tf.convert_to_tensor(flat))

    def state(self) -> dict[str, Any]:
        """Kind, step and slots, each slot one flat float32 array (none before the first step)."""
        slots = {name: flatten(variables) for name, variables in self.slots.items()} if self.step_count else {}
        return {"kind": self.kind.value, "step": self.step_count, "slots": slots}

    def load_state(self, state: dict[str, Any], size: int) -> None:
        """Restore `state()`; raises ValueError when it is another optimizer's or size's."""
        slots, step = state["slots"], int(state["step"])
        expected = set(self.slots) if step else set()
        if state["kind"] != self.kind.value or set(slots) != expected or any(np.shape(v) != (size,) for v in slots.values()):
            raise ValueError(f"optimizer state of {state['kind']!r} does not fit {self.kind.value!r} "
                             f"over {size} parameters")
        for name, assign in self._assign_slots.items():
            assign(np.asarray(slots[name], dtype=np.float32) if step else np.zeros(size, np.float32), f"slot {name}")
        self.step.assign(step)

    def update(self, grads: Sequence[tf.Tensor]) -> None:
        """One step, traced into the caller's tf.function (`apply` is this, compiled alone)."""
        self.step.assign_add(1)
        UPDATES[self.kind](self, [tf.cast(g, p.dtype) for p, g in zip(self.params, grads)])

    def _update_flat(self, flat: tf.Tensor) -> None:
        self.update([tf.reshape(g, p.shape) for p, g in zip(self.params, tf.split(flat, self.sizes))])
