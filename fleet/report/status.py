"""What a job is doing, from its run directory alone: the events log read back (pure).

`replay(events, max_epochs)` turns ``events.jsonl``'s records into each model's state (waiting,
training on which GPUs, checkpointed, converged), its epochs and best validation accuracy, and
the job's progress; `render(...)` writes the lines `fleet status` prints. A job that resumed
in the same run directory appended to the same log: a model that was training when a job
ended without saying so (killed) is waiting again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from fleet.report.table import format_gpus, format_table


@dataclass
class ModelStatus:
    model: str
    max_epochs: int
    state: str = "waiting"  # waiting, training, checkpointed, converged
    gpus: tuple[int, ...] = ()
    epochs: int = 0
    best_accuracy: float | None = None
    last_loss: float | None = None
    reason: str = ""


@dataclass
class JobStatus:
    models: dict[str, ModelStatus]
    jobs: int = 0  # run_start records: the first job and each resume
    round: int | None = None
    started: float | None = None  # the current job's run_start time
    ended: dict | None = None  # the current job's run_end record, if it wrote one
    epochs_this_job: int = 0

    @property
    def epochs_done(self) -> int:
        return sum(m.epochs for m in self.models.values())

    @property
    def epochs_at_most(self) -> int:
        """Epochs the ensemble trains at most: converged models' own, the others' max_epochs."""
        return sum(m.epochs if m.state == "converged" else max(m.max_epochs, m.epochs) for m in self.models.values())


def _on_event(job: JobStatus, event: Mapping) -> None:
    kind, model = event.get("event"), job.models.get(event.get("model", ""))
    if kind == "run_start":
        job.jobs += 1
        job.started, job.ended, job.epochs_this_job = event["time"], None, 0
        for status in job.models.values():
            if status.state == "training":  # the job before ended without saying so
                status.state, status.gpus = "waiting", ()
    elif kind == "run_end":
        job.ended = dict(event)
    elif kind == "round_start":
        job.round = event.get("index")
    elif model is None:
        return
    elif kind == "member_start":
        model.state, model.gpus = "training", tuple(event.get("gpus", ()))
    elif kind == "epoch":
        model.epochs = int(event["epoch"])
        job.epochs_this_job += 1
        model.last_loss = float(event["train_loss"])
        accuracy = float(event["val_accuracy"])
        model.best_accuracy = accuracy if model.best_accuracy is None else max(model.best_accuracy, accuracy)
    elif kind == "converged":
        model.state, model.gpus, model.reason = "converged", (), str(event.get("reason", ""))
    elif kind == "member_left" and model.state != "converged":
        model.state, model.gpus = "checkpointed", ()


def replay(events: Iterable[Mapping], max_epochs: Mapping[str, int]) -> JobStatus:
    """Each model's state and the job's progress after `events` (in log order)."""
    job = JobStatus({m: ModelStatus(m, limit) for m, limit in max_epochs.items()})
    for event in events:
        _on_event(job, event)
    return job


def time_left(job: JobStatus, now: float) -> float | None:
    """Seconds left at this job's pace so far (epochs per second), at most; None before the
    job has finished an epoch."""
    if job.started is None or job.ended is not None or job.epochs_this_job == 0:
        return None
    pace = job.epochs_this_job / max(now - job.started, 1e-9)
    return (job.epochs_at_most - job.epochs_done) / pace


def _state_cell(status: ModelStatus) -> str:
    return f"converged ({status.reason})" if status.state == "converged" and status.reason else status.state


def render(job: JobStatus, headline: str, slot: str = "GPU") -> list[str]:
    """The lines of `fleet status`: a headline, the progress, one row per model."""
    converged = sum(m.state == "converged" for m in job.models.values())
    lines = [headline,
             f"{job.epochs_done}/{job.epochs_at_most} epochs (at most: stop rules end models early), "
             f"{converged}/{len(job.models)} models converged"
             + (f", round {job.round}" if job.round is not None else "")]
    order = {"training": 0, "checkpointed": 1, "waiting": 2, "converged": 3}
    rows = [
        (m.model, _state_cell(m), format_gpus(m.gpus) if m.gpus else "-", f"{m.epochs}/{m.max_epochs}",
         "-" if m.best_accuracy is None else f"{m.best_accuracy:.3f}", "-" if m.last_loss is None else f"{m.last_loss:.4f}")
        for m in sorted(job.models.values(), key=lambda m: (order.get(m.state, 9), m.model))
    ]
    return lines + format_table(("model", "state", slot, "epoch", "best val acc", "last loss"), rows).splitlines()
