"""What really happened in a run, read back from ``events.jsonl`` (pure).

`tell_story(events, ...)` turns the log into the jobs that ran (the first and each resume),
every *stint* (a model holding its GPUs from ``member_start`` to ``member_left``), the rounds,
checkpoints and regroups, each on one clock: the seconds the jobs ran, from the first job's
start, the time between a job and its resume left out (a requeued batch job may wait hours;
each job starts where the one before ended). A stint still
open when a job ended without saying so (killed) ends at that job's last record; one open in a
running job ends now. `epoch_records` keeps each model's last record per epoch (a resumed job
repeats the epochs after the last checkpoint). Charts and the page are drawn from these.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class EpochSpan:
    """One epoch of a stint: it ended at `end` after `wall_s` seconds; the group computed a
    `compute_share` of that time (its consumption rate over its compute rate, at most 1) and
    waited for data the rest; its checkpoint took `checkpoint_s` after it. `samples`: the
    epoch's samples, a part trained before a resume included (0 where the log has none)."""

    end: float
    wall_s: float
    compute_share: float
    checkpoint_s: float
    samples: int = 0


@dataclass(frozen=True)
class Stint:
    model: str
    gpus: tuple[int, ...]
    stream: int | None
    start: float
    end: float
    outcome: str  # converged, checkpointed, killed (its job died), running
    epochs: tuple[EpochSpan, ...] = ()
    final_checkpoint_s: float = 0.0  # the save as it left (member_left's checkpoint_s)
    start_s: float = 0.0  # from its launch to its first step, as its master reported it
    left_samples: int = 0  # where in its epoch it left (member_left's epoch_samples): 0 at an epoch's end


@dataclass(frozen=True)
class Job:
    start: float
    end: float
    state: str  # finished, interrupted (checkpointed on a signal), killed, running


@dataclass(frozen=True)
class RunStory:
    gpus: int
    jobs: tuple[Job, ...]
    stints: tuple[Stint, ...]
    rounds: tuple[float, ...]  # each round's start
    checkpoints: tuple[tuple[float, str], ...]  # (time, model): a model checkpointed mid-epoch to leave
    regroups: tuple[tuple[float, int], ...]  # (time, stream): a stream's members changed
    decoded: int  # training samples the preprocessors decoded (every stream, every job)

    @property
    def end(self) -> float:
        return max((j.end for j in self.jobs), default=0.0)

    @property
    def state(self) -> str:
        """The last job's state; ``not started`` before any."""
        return self.jobs[-1].state if self.jobs else "not started"

    @property
    def training_s(self) -> float:
        """Seconds the jobs ran."""
        return sum(j.end - j.start for j in self.jobs)


@dataclass
class _Open:
    """A stint being read."""

    model: str
    gpus: tuple[int, ...]
    stream: int | None
    start: float
    epochs: list[EpochSpan] = field(default_factory=list)
    start_s: float = 0.0

    def took(self, event: Mapping) -> None:
        """Keep the start the member reported (in its first report only)."""
        self.start_s = self.start_s or _number(event, "start_s")

    def close(self, end: float, outcome: str, final_checkpoint_s: float = 0.0, left_samples: int = 0) -> Stint:
        return Stint(self.model, self.gpus, self.stream, self.start, max(end, self.start), outcome,
                     tuple(self.epochs), final_checkpoint_s, self.start_s, left_samples)


class _Reader:
    """Reads the log record by record (see `tell_story`)."""

    def __init__(self):
        self.shift = 0.0  # the job clock is wall-clock time minus this
        self.open: dict[str, _Open] = {}
        self.stints: list[Stint] = []
        self.jobs: list[Job] = []
        self.job_start: float | None = None
        self.last = 0.0
        self.rounds: list[float] = []
        self.checkpoints: list[tuple[float, str]] = []
        self.regroups: list[tuple[float, int]] = []
        self.decoded = 0

    def read(self, event: Mapping) -> None:
        kind = event.get("event")
        wall = _number(event, "time")
        if kind == "run_start":
            self.end_job(self.last, "killed")
            self.shift = wall - self.last
            self.job_start = self.last
        at = wall - self.shift
        self.last = max(self.last, at)
        handler = getattr(self, f"on_{kind}", None)
        if handler is not None and self.job_start is not None:
            handler(event, at)

    def end_job(self, at: float, state: str, outcome: str | None = None) -> None:
        if self.job_start is None:
            return
        for stint in self.open.values():
            self.stints.append(stint.close(at, outcome or state))
        self.open.clear()
        self.jobs.append(Job(self.job_start, max(at, self.job_start), state))
        self.job_start = None

    def on_run_end(self, event: Mapping, at: float) -> None:
        interrupted = bool(event.get("interrupted"))
        self.end_job(at, "interrupted" if interrupted else "finished", "checkpointed" if interrupted else None)

    def on_round_start(self, event: Mapping, at: float) -> None:
        self.rounds.append(at)

    def on_member_start(self, event: Mapping, at: float) -> None:
        model = str(event.get("model"))
        stream = event.get("stream")
        self.open[model] = _Open(model, tuple(int(g) for g in event.get("gpus", ())),
                                 int(stream) if stream is not None else None, at)

    def on_epoch(self, event: Mapping, at: float) -> None:
        stint = self.open.get(str(event.get("model")))
        if stint is None:
            return
        compute, consumed = _number(event, "samples_per_s"), _number(event, "stream_samples_per_s")
        share = min(1.0, consumed / compute) if compute > 0 else 1.0
        stint.took(event)
        stint.epochs.append(EpochSpan(at, _number(event, "epoch_s"), share, _number(event, "checkpoint_s"),
                                      int(_number(event, "samples"))))

    def on_member_left(self, event: Mapping, at: float) -> None:
        stint = self.open.pop(str(event.get("model")), None)
        if stint is not None:
            outcome = "converged" if event.get("converged") else "checkpointed"
            stint.took(event)
            self.stints.append(stint.close(at, outcome, _number(event, "checkpoint_s"),
                                           int(_number(event, "epoch_samples"))))

    def on_checkpoint(self, event: Mapping, at: float) -> None:
        self.checkpoints.append((at, str(event.get("model"))))

    def on_regroup(self, event: Mapping, at: float) -> None:
        self.regroups.append((at, int(event.get("stream", -1))))

    def on_stream_end(self, event: Mapping, at: float) -> None:
        self.decoded += int(_number(event, "decoded"))


def _number(event: Mapping, key: str) -> float:
    value = event.get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


def tell_story(events: Iterable[Mapping], gpus: int, now: float | None = None, running: bool = False) -> RunStory:
    """The run in `events` (log order) on `gpus` GPUs. `running`: a job is running now (its
    open stints end at `now`, wall-clock seconds like the records' ``time``); otherwise a job
    that wrote no ``run_end`` was killed at its last record."""
    reader = _Reader()
    for event in events:
        if isinstance(event, Mapping):
            reader.read(event)
    if running and now is not None:
        reader.end_job(max(now - reader.shift, reader.last), "running")
    else:
        reader.end_job(reader.last, "killed")
    return RunStory(gpus, tuple(reader.jobs), tuple(sorted(reader.stints, key=lambda s: (s.start, s.gpus))),
                    tuple(reader.rounds), tuple(reader.checkpoints), tuple(reader.regroups), reader.decoded)


def epoch_records(events: Iterable[Mapping]) -> dict[str, list[dict]]:
    """Per model, its epoch records in epoch order, the last record of each epoch kept."""
    by_model: dict[str, dict[int, dict]] = {}
    for event in events:
        if isinstance(event, Mapping) and event.get("event") == "epoch" and isinstance(event.get("epoch"), int):
            by_model.setdefault(str(event.get("model")), {})[event["epoch"]] = dict(event)
    return {model: [epochs[k] for k in sorted(epochs)] for model, epochs in by_model.items()}
