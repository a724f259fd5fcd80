"""`results.json` and `leaderboard.csv`: what a run produced, per model and as a whole."""

from __future__ import annotations

import csv
import io
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from fleet.atomic import atomic_write_json, atomic_write_text


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


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def leaderboard_rows(models: list[ModelResult]) -> list[ModelResult]:
    """Best first: by best metric (accuracy up, loss down); models without one last."""
    def key(m: ModelResult) -> tuple[int, float]:
        if _finite(m.best_metric) is None:
            return (1, 0.0)
        return (0, -m.best_metric if m.metric == "val_accuracy" else m.best_metric)

    return sorted(models, key=key)


LEADERBOARD_COLUMNS = (
    "rank", "id", "family", "metric", "best_metric", "best_epoch", "best_val_accuracy",
    "epochs", "converged", "stop_reason", "final_train_loss", "parameters", "gpu_seconds",
)


def leaderboard_csv(models: list[ModelResult]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=LEADERBOARD_COLUMNS, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for rank, model in enumerate(leaderboard_rows(models), start=1):
        writer.writerow({"rank": rank, **asdict(model)})
    return out.getvalue()


def write_results(run_dir: str | os.PathLike, run: RunResult) -> None:
    """Write `results.json` and `leaderboard.csv` into `run_dir`, each atomically."""
    run_dir = Path(run_dir)
    doc = asdict(run)
    doc["models"] = [asdict(m) for m in run.models]
    atomic_write_json(run_dir / "results.json", doc)
    atomic_write_text(run_dir / "leaderboard.csv", leaderboard_csv(run.models))
