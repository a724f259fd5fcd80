"""`results.json` and `leaderboard.csv`: what a run produced, per model and as a whole."""

from __future__ import annotations

import csv
import io
import json
import math
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from fleet.atomic import atomic_write_json, atomic_write_text
from fleet.report.group_results import GroupResult, by_group, group_ranks

EARLY_STOP_REASON = "early_stop"
"""A model's ``stop_reason`` (and its ``converged`` event's ``reason``) when early stopping stopped it."""


@dataclass(frozen=True)
class ModelResult:
    id: str
    family: str
    parameters: int
    epochs: int
    converged: bool
    stop_reason: str | None
    metric: str
    best_metric: float | None
    best_epoch: int
    best_val_accuracy: float | None
    final_train_loss: float | None
    gpu_seconds: float
    history: list[dict] = field(default_factory=list)  # per epoch: epoch, train_loss, val_loss, val_accuracy, ...
    rung: int | None = None  # the rung (its index among the model's rungs, from 0) where early stopping stopped it


@dataclass(frozen=True)
class RunResult:
    name: str
    policy: str
    gpus: int
    makespan_s: float
    rounds: int
    samples_decoded: int
    overhead_s: dict[str, float]
    models: list[ModelResult] = field(default_factory=list)
    validation_samples_decoded: int = 0
    chunks_in_shared_memory: int = 0  # chunks whose root master read them in place (fleet.runtime.data.shm)
    interrupted: bool = False  # stopped by the checkpoint signal; run again to resume
    policy_choice: dict = field(default_factory=dict)  # policy auto: chosen, predicted_makespan_s per candidate
    early_stop: dict = field(default_factory=dict)  # the run's early-stopping setting; {} without early stopping
    prediction: dict = field(default_factory=dict)  # the run's forecast of itself beside what it measured; {}: none
    groups: dict = field(default_factory=dict)  # data.group_by: each model's id -> its group's raw key; {}: none

    @classmethod
    def from_dict(cls, doc: Mapping) -> RunResult:
        """The run a ``results.json`` document holds; fields an older fleet did not write take
        their defaults, fields this fleet does not know are ignored."""
        models = [ModelResult(**_known(ModelResult, m)) for m in doc.get("models", ())]
        return cls(**{**_known(cls, doc), "models": models})


def _known(kind: type, doc: Mapping) -> dict:
    names = {f.name for f in fields(kind)}
    return {k: v for k, v in doc.items() if k in names}


def read_results(run_dir: str | os.PathLike) -> RunResult:
    """`run_dir`'s ``results.json`` read back (older files included).

    Raises:
        OSError: the file cannot be read.
        ValueError: it is not JSON.
    """
    return RunResult.from_dict(json.loads((Path(run_dir) / "results.json").read_text(encoding="utf-8")))


def stopped_early(model: ModelResult) -> bool:
    """Whether early stopping stopped `model` at a rung (not its own stop rule)."""
    return model.stop_reason == EARLY_STOP_REASON or model.rung is not None


def epochs_saved(models: list[ModelResult], max_epochs: Mapping[str, int]) -> int:
    """Model-epochs early stopping saved at most: each stopped model's ``max_epochs`` (its
    spec's) less the epochs it trained; its own stop rule might have ended it sooner."""
    return sum(max(max_epochs.get(m.id, m.epochs) - m.epochs, 0) for m in models if stopped_early(m))


def model_end(model: ModelResult) -> str:
    """How `model`'s training ended, for people: ``converged (patience)``, ``stopped at rung 2
    (3 epochs)`` (rungs counted from 1), ``diverged`` or ``not finished``."""
    if model.stop_reason == "diverged":
        return "diverged"
    if stopped_early(model):
        where = f"at rung {model.rung + 1}" if model.rung is not None else "early"
        return f"stopped {where} ({model.epochs} epoch{'' if model.epochs == 1 else 's'})"
    if model.converged:
        return f"converged ({model.stop_reason})" if model.stop_reason else "converged"
    return "not finished"


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def leaderboard_rows(models: list[ModelResult]) -> list[ModelResult]:
    """Best first: by best metric (accuracy up, loss down); models without one last."""
    def key(m: ModelResult) -> tuple[int, float]:
        if _finite(m.best_metric) is None:
            return (1, 0.0)
        return (0, -m.best_metric if m.metric == "val_accuracy" else m.best_metric)

    return sorted(models, key=key)


def group_results(models: list[ModelResult], groups: Mapping[str, str]) -> list[GroupResult]:
    """Each group's models ranked among themselves, its best configuration and whether it is
    done, the largest group first (`fleet.report.group_results`); [] without groups."""
    return by_group(leaderboard_rows(models), groups) if groups else []


LEADERBOARD_COLUMNS = (
    "rank", "id", "family", "metric", "best_metric", "best_epoch", "best_val_accuracy",
    "epochs", "converged", "stop_reason", "final_train_loss", "parameters", "gpu_seconds", "end",
    "group", "group_rank",
)  # scripts read these by name: a new column goes last


def leaderboard_csv(models: list[ModelResult], groups: Mapping[str, str] | None = None) -> str:
    """The leaderboard, best first; with `groups` (model id -> group key), ordered by group
    (the largest first) and within each by rank, with each model's group and rank in it
    (``rank`` stays the rank among all models)."""
    ranked = leaderboard_rows(models)
    rank = {m.id: k for k, m in enumerate(ranked, start=1)}
    per_group = group_results(models, groups or {})
    rows = [m for g in per_group for m in g.ranked] if per_group else ranked
    in_group = group_ranks(per_group)
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=LEADERBOARD_COLUMNS, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for model in rows:
        writer.writerow({"rank": rank[model.id], **asdict(model), "end": model_end(model),
                         "group": (groups or {}).get(model.id, ""), "group_rank": in_group.get(model.id, "")})
    return out.getvalue()


def write_results(run_dir: str | os.PathLike, run: RunResult) -> None:
    """Write `results.json` (with ``group_results`` from the models and their groups) and
    `leaderboard.csv` into `run_dir`, each atomically."""
    run_dir = Path(run_dir)
    doc = asdict(run)
    doc["models"] = [asdict(m) for m in run.models]
    doc["group_results"] = [g.record() for g in group_results(run.models, run.groups)]
    atomic_write_json(run_dir / "results.json", doc)
    atomic_write_text(run_dir / "leaderboard.csv", leaderboard_csv(run.models, run.groups))
