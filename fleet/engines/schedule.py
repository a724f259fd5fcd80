"""Learning-rate schedules over epochs (pure functions of the epoch number)."""

from __future__ import annotations

import math

from fleet.spec.sections import LRSchedule, ScheduleKind, TrainSpec


def warmup_factor(epoch: int, warmup_epochs: int) -> float:
    """Linear warm-up: ``(epoch + 1) / (warmup_epochs + 1)`` during it, then 1."""
    if epoch >= warmup_epochs:
        return 1.0
    return (epoch + 1) / (warmup_epochs + 1)


def decay_factor(schedule: LRSchedule, epochs_after_warmup: int, decay_epochs: int) -> float:
    """The schedule's factor `t` epochs after warm-up, over a decay span of `decay_epochs`.

    constant: 1. cosine: ``0.5 * (1 + cos(pi * min(t, span) / span))``.
    step: ``gamma ** (t // step_epochs)``.
    """
    t = epochs_after_warmup
    if schedule.kind is ScheduleKind.COSINE:
        span = max(decay_epochs, 1)
        return 0.5 * (1.0 + math.cos(math.pi * min(t, span) / span))
    if schedule.kind is ScheduleKind.STEP:
        return schedule.gamma ** (t // schedule.step_epochs)
    return 1.0


def learning_rate(base_lr: float, schedule: LRSchedule, epoch: int, max_epochs: int) -> float:
    """The learning rate of (0-based) `epoch`.

    During the first ``w = warmup_epochs`` epochs: ``base_lr * (epoch + 1) / (w + 1)``.
    After them, with ``t = epoch - w``: ``base_lr`` times the decay factor, where cosine decays
    over the remaining ``max_epochs - w`` epochs (reaching 0 at ``max_epochs``) and step
    multiplies by ``gamma`` every ``step_epochs``.
    """
    w = schedule.warmup_epochs
    if epoch < w:
        return base_lr * warmup_factor(epoch, w)
    return base_lr * decay_factor(schedule, epoch - w, max_epochs - w)


def epoch_lr(train: TrainSpec, epoch: int) -> float:
    """The learning rate of (0-based) `epoch` under a model's training section (`learning_rate`
    of its ``lr``, ``schedule`` and ``max_epochs``): what an engine's `_schedule_lr` sets."""
    return learning_rate(train.lr, train.schedule, epoch, train.max_epochs)
