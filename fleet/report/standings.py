"""Each model's standing so far, from the events log and the spec (pure): the same
`ModelResult` rows ``results.json`` holds, for a finished, an interrupted or a running job."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

from fleet.report.results import EARLY_STOP_REASON, ModelResult
from fleet.report.run_story import RunStory, epoch_records


def _finite(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def standings(events: Sequence[Mapping], models: Iterable, story: RunStory) -> list[ModelResult]:
    """One `ModelResult` per spec model (`models`: the spec's `ModelSpec`s) in spec order;
    GPU-seconds are the GPUs its stints held."""
    history = epoch_records(events)
    ends = {str(e.get("model")): e for e in events if e.get("event") == "converged"}
    parameters = {str(e.get("model")): int(e.get("parameters") or 0) for e in events if e.get("event") == "member_left"}
    held: dict[str, float] = {}
    for stint in story.stints:
        held[stint.model] = held.get(stint.model, 0.0) + (stint.end - stint.start) * len(stint.gpus)
    return [_standing(m, history.get(m.id, []), ends.get(m.id), parameters.get(m.id, 0), held.get(m.id, 0.0)) for m in models]


def _standing(model, epochs: list[dict], end: Mapping | None, parameters: int, gpu_s: float) -> ModelResult:
    """`model`'s row; `end` is its ``converged`` event (None: it has not ended)."""
    metric = model.train.stop.metric.value
    scored = [(e["epoch"], _finite(e.get(metric))) for e in epochs]
    scored = [(epoch, value) for epoch, value in scored if value is not None]
    best_epoch, best = 0, None
    if scored:
        pick = max if metric == "val_accuracy" else min
        best_epoch, best = pick(scored, key=lambda s: s[1])
    accuracies = [v for v in (_finite(e.get("val_accuracy")) for e in epochs) if v is not None]
    reason = None if end is None else str(end.get("reason", ""))
    rung = end.get("rung") if end is not None and reason == EARLY_STOP_REASON else None
    return ModelResult(
        id=model.id, family=model.family, parameters=parameters, epochs=len(epochs), converged=end is not None,
        stop_reason=reason, metric=metric, best_metric=best, best_epoch=best_epoch,
        best_val_accuracy=max(accuracies) if accuracies else None,
        final_train_loss=_finite(epochs[-1].get("train_loss")) if epochs else None,
        gpu_seconds=gpu_s, history=epochs, rung=rung if isinstance(rung, int) else None,
    )
