"""What a job is doing, from its run directory alone: the events log read back (pure).

`replay(events, max_epochs)` turns ``events.jsonl``'s records into each model's state (waiting,
training on which GPUs, checkpointed, converged, held at a rung), its epochs and best
validation accuracy, and the job's progress; `render(...)` writes the lines `fleet status`
prints. A job that resumed in the same run directory appended to the same log: a model that
was training when a job ended without saying so (killed) is waiting again.

With early stopping, the ``rung`` events say how the rungs fill: each model's standing verdict
per rung (a ``paused`` model is held at its rung until ``promoted`` or ``stopped``), and a model
stopped there is ``stopped at rung K`` (rungs counted from 1 for people).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from fleet.report.results import EARLY_STOP_REASON
from fleet.report.rungs import VERDICTS, is_on, planned_rungs
from fleet.report.table import format_gpus, format_table


@dataclass
class ModelStatus:
    model: str
    max_epochs: int
    state: str = "waiting"  # waiting, training, checkpointed, converged, held (paused at a rung)
    gpus: tuple[int, ...] = ()
    epochs: int = 0
    best_accuracy: float | None = None
    last_loss: float | None = None
    reason: str = ""
    rung: int | None = None  # held at, or stopped by early stopping at, this rung (its index, from 0)
    reached: int = 0  # the most epochs it reported (a resumed job repeats epochs after its checkpoint)


@dataclass
class JobStatus:
    models: dict[str, ModelStatus]
    jobs: int = 0  # run_start records: the first job and each resume
    round: int | None = None
    started: float | None = None  # the current job's run_start time
    ended: dict | None = None  # the current job's run_end record, if it wrote one
    epochs_this_job: int = 0
    early_stop: dict = field(default_factory=dict)  # the current job's setting; {} without early stopping
    rungs: dict[int, dict[str, str]] = field(default_factory=dict)  # rung epochs -> model -> its standing verdict
    groups: dict[str, str] = field(default_factory=dict)  # data.group_by: model -> its group's key; {} without

    @property
    def stops_early(self) -> bool:
        return bool(self.early_stop) or bool(self.rungs)

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
        job.early_stop = dict(event["early_stop"]) if is_on(event.get("early_stop")) else {}
        for status in job.models.values():
            if status.state == "training":  # the job before ended without saying so
                status.state = "waiting"
            status.gpus = ()
    elif kind == "run_end":
        job.ended = dict(event)
    elif kind == "round_start":
        job.round = event.get("index")
    elif model is None:
        return
    elif kind == "member_start":
        model.state, model.gpus = "training", tuple(event.get("gpus", ()))
    elif kind == "rung":
        _on_rung(job, model, event)
    elif kind == "epoch":
        model.epochs = int(event["epoch"])
        model.reached = max(model.reached, model.epochs)
        job.epochs_this_job += 1
        model.last_loss = float(event["train_loss"])
        accuracy = float(event["val_accuracy"])
        model.best_accuracy = accuracy if model.best_accuracy is None else max(model.best_accuracy, accuracy)
    elif kind == "converged":
        model.state, model.gpus, model.reason = "converged", (), str(event.get("reason", ""))
        if model.reason == EARLY_STOP_REASON and isinstance(event.get("rung"), int):
            model.rung = event["rung"]
    elif kind == "member_left":
        model.gpus = ()
        model.state = model.state if model.state in ("converged", "held") else "checkpointed"


def _on_rung(job: JobStatus, model: ModelStatus, event: Mapping) -> None:
    """A rung decision: the rung's tally, and the model's state where the verdict changes it. A
    paused model keeps its GPUs until it leaves; promoted before it left, it trains on."""
    verdict, index = str(event.get("verdict")), event.get("index")
    if isinstance(event.get("rung"), int):
        job.rungs.setdefault(event["rung"], {})[model.model] = verdict
    if verdict == "stopped":
        model.state, model.gpus, model.reason, model.rung = "converged", (), EARLY_STOP_REASON, index
    elif verdict == "paused":
        model.state, model.rung = "held", index
    elif verdict == "promoted" and model.state == "held":
        model.state, model.rung = "training" if model.gpus else "waiting", None


def replay(events: Iterable[Mapping], max_epochs: Mapping[str, int],
           groups: Mapping[str, str] | None = None) -> JobStatus:
    """Each model's state and the job's progress after `events` (in log order); `groups`:
    each model's group with `data.group_by`."""
    job = JobStatus({m: ModelStatus(m, limit) for m, limit in max_epochs.items()}, groups=dict(groups or {}))
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


def _rung_name(index: int | None) -> str:
    return f"rung {index + 1}" if isinstance(index, int) else "a rung"


def _state_cell(status: ModelStatus) -> str:
    if status.state == "held":
        return f"held at {_rung_name(status.rung)}"
    if status.state == "converged" and status.reason == EARLY_STOP_REASON:
        return f"stopped at {_rung_name(status.rung)}"
    return f"converged ({status.reason})" if status.state == "converged" and status.reason else status.state


def rung_lines(job: JobStatus) -> list[str]:
    """How the rungs fill: per rung's epochs, the models that reported them, those decided
    there, and how many stand at each verdict; [] without early stopping."""
    if not job.stops_early:
        return []
    epochs = sorted(set(planned_rungs(job.early_stop)) | set(job.rungs))
    rows = []
    for rung in epochs:
        standing = list(job.rungs.get(rung, {}).values())
        reported = sum(m.reached >= rung for m in job.models.values())
        rows.append((rung, reported, len(standing), *(standing.count(v) for v in VERDICTS)))
    method = job.early_stop.get("method", "recorded")
    head = f"early stopping ({method}): rungs filling; a model's last verdict at a rung counts"
    return [head, *format_table(("rung at epoch", "reported", "decided", *VERDICTS), rows).splitlines()]


def _early_counts(job: JobStatus) -> str:
    if not job.stops_early:
        return ""
    stopped = sum(m.state == "converged" and m.reason == EARLY_STOP_REASON for m in job.models.values())
    held = sum(m.state == "held" for m in job.models.values())
    return f" ({stopped} stopped by early stopping), {held} held at a rung"


def _group_counts(job: JobStatus) -> str:
    """With groups: how many groups have every model converged."""
    if not job.groups:
        return ""
    open_groups = {job.groups[m] for m, status in job.models.items() if status.state != "converged"}
    every = set(job.groups.values())
    return f", {len(every - open_groups)}/{len(every)} groups done"


def render(job: JobStatus, headline: str, slot: str = "GPU") -> list[str]:
    """The lines of `fleet status`: a headline, the progress, one row per model."""
    converged = sum(m.state == "converged" for m in job.models.values())
    lines = [headline,
             f"{job.epochs_done}/{job.epochs_at_most} epochs (at most: stop rules end models early), "
             f"{converged}/{len(job.models)} models converged" + _group_counts(job) + _early_counts(job)
             + (f", round {job.round}" if job.round is not None else "")]
    order = {"training": 0, "checkpointed": 1, "held": 2, "waiting": 3, "converged": 4}
    rows = [
        (m.model, _state_cell(m), format_gpus(m.gpus) if m.gpus else "-", f"{m.epochs}/{m.max_epochs}",
         "-" if m.best_accuracy is None else f"{m.best_accuracy:.3f}", "-" if m.last_loss is None else f"{m.last_loss:.4f}")
        for m in sorted(job.models.values(), key=lambda m: (order.get(m.state, 9), m.model))
    ]
    table = format_table(("model", "state", slot, "epoch", "best val acc", "last loss"), rows).splitlines()
    return lines + rung_lines(job) + table
