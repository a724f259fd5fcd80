"""The stop rule: when a model has converged (pure; the coordinator applies it each epoch)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from enum import Enum

from fleet.spec import StopMetric, StopRule


class StopReason(str, Enum):
    TARGET = "target"  # the metric reached the rule's target
    PATIENCE = "patience"  # no improvement by min_delta for `patience` epochs
    MAX_EPOCHS = "max_epochs"
    DIVERGED = "diverged"  # the training loss is no longer finite


@dataclass
class StopTracker:
    """Follows one model's validation metric across epochs; `update` says when to stop.

    The state is a few numbers (`to_dict`/`from_dict`), checkpointed with the model.
    """

    rule: StopRule
    max_epochs: int
    epochs: int = 0
    best: float | None = None
    best_epoch: int = 0
    stale_epochs: int = 0
    reason: StopReason | None = field(default=None)

    @property
    def higher_is_better(self) -> bool:
        return self.rule.metric is StopMetric.VAL_ACCURACY

    def _improves(self, value: float) -> bool:
        if self.best is None:
            return True
        gain = value - self.best if self.higher_is_better else self.best - value
        return gain > self.rule.min_delta

    def _reached_target(self, value: float) -> bool:
        target = self.rule.target
        if target is None:
            return False
        return value >= target if self.higher_is_better else value <= target

    def update(self, metrics: dict[str, float]) -> StopReason | None:
        """Record one finished epoch's metrics; return why to stop, or None to go on."""
        value = float(metrics[self.rule.metric.value])
        self.epochs += 1
        if math.isfinite(value) and self._improves(value):
            self.best, self.best_epoch, self.stale_epochs = value, self.epochs, 0
        else:
            self.stale_epochs += 1
        if not math.isfinite(float(metrics.get("train_loss", 0.0))):
            self.reason = StopReason.DIVERGED
        elif math.isfinite(value) and self._reached_target(value):
            self.reason = StopReason.TARGET
        elif self.stale_epochs >= self.rule.patience:
            self.reason = StopReason.PATIENCE
        elif self.epochs >= self.max_epochs:
            self.reason = StopReason.MAX_EPOCHS
        return self.reason

    @property
    def converged(self) -> bool:
        return self.reason is not None

    def to_dict(self) -> dict:
        state = asdict(self)
        state.pop("rule")
        state["reason"] = self.reason.value if self.reason else None
        return state

    @classmethod
    def from_dict(cls, rule: StopRule, state: dict) -> "StopTracker":
        fields = dict(state)
        fields["reason"] = StopReason(fields["reason"]) if fields.get("reason") else None
        return cls(rule=rule, **fields)
