"""What a model's group master keeps of its best epoch: the class probabilities its validation
pass computed anyway, the test split's (one more pass, only for a new best), and a link to the
checkpoint saved after that epoch (`fleet.report.predictions` has the layout)."""

from __future__ import annotations

from typing import Any

import numpy as np

from fleet.report.predictions import TEST, VALIDATION, Checkpoint, commit_best, improves, write_labels
from fleet.runtime.context import RunContext
from preprocess.grouped import unique_parts


def keeps_predictions(ctx: RunContext) -> bool:
    """Every model is validated on the same samples (with `data.group_by`, every model of a
    group on its group's), unless partitioned data validates each epoch on its own node's
    partition (`data.validation: local`): then none are kept."""
    data = ctx.spec.data
    return not (data.partitioned and data.validation == "local")


def group_part(spec: Any, model: Any) -> str | None:
    """The id part of `model`'s group, which names its group's labels files (None: no group)."""
    if model.group is None:
        return None
    return unique_parts({m.group for m in spec.models if m.group is not None})[model.group]


class BestPredictions:
    """Keeps one model's best-epoch predictions, on its group's master (others do nothing).

    Args:
        ctx: the rank's context (its run directory, validation and test sets).
        model: the model's spec (its id and stop metric).
        is_master: this trainer is the group's master (it writes the model's files).
    """

    def __init__(self, ctx: RunContext, model: Any, is_master: bool):
        self.ctx, self.model = ctx, model
        self.active = is_master and keeps_predictions(ctx)
        self.group = group_part(ctx.spec, model) if self.active else None

    def epoch_ended(self, engine: Any, history: list[dict], probabilities: np.ndarray | None,
                    saved: Any | None) -> None:
        """After an epoch's checkpoint (`saved`: its `SaveInfo`): keep the epoch's predictions
        when its metric beats every earlier epoch's (`history`: the model's epochs, this one last)."""
        if not self.active or probabilities is None or not history:
            return
        metric = self.model.train.stop.metric.value
        values = [record.get(metric) for record in history]
        if not improves(values[-1], values[:-1], metric):
            return
        run_dir = self.ctx.run_dir
        val_labels = self.ctx.validation_of(self.model.group)[1]
        write_labels(run_dir, VALIDATION, val_labels, self.group)
        kept = {VALIDATION: probabilities}
        test = self.ctx.test_of(self.model.group)
        if test is not None:
            kept[TEST] = engine.predict(test[0])
            write_labels(run_dir, TEST, test[1], self.group)
        checkpoint = None if saved is None else Checkpoint(saved.path, saved.sha256, saved.bytes)
        commit_best(run_dir, self.model.id, int(history[-1]["epoch"]), {metric: values[-1]}, kept, checkpoint)
