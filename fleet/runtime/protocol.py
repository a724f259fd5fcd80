"""Control-plane messages between the coordinator (rank 0) and the other ranks.

They are small pickled objects sent with `isend` on the control communicator; the data
plane (sample chunks, gradients) never goes through here. Tags separate the receivers:
a trainer's main thread, a master's stream thread, a preprocessor, and the coordinator.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any


class Tag(int, Enum):
    TRAINER = 11  # coordinator -> a trainer rank's main thread
    PREPROCESSOR = 13  # coordinator -> a preprocessor
    REPORT = 14  # any rank -> coordinator
    STARTUP = 15  # the first trainer -> rank 0, once at start-up (`fleet.runtime.rank`)


INBOX_DEPTH = 2
"""Chunks a master keeps receives posted for ahead of the one it takes (posted again from the
new roots at a regroup); a switch chunk is chosen at least this far past what the
preprocessors had made, or at the stream's end (see `Coordinator._on_paused`)."""


def stream_tag(stream: int) -> int:
    """Tag of commands for a master's stream thread (one tag per stream, so a draining
    thread of an old stream never takes the messages of a new one on the same rank)."""
    return 1000 + stream % 30_000


# ---------------------------------------------------------------- stream layout


@dataclass(frozen=True)
class StreamLayout:
    """Who moves one stream's chunks from a given chunk index on.

    Chunk k is decoded by preprocessor `preprocessors[k % P]` and sent to its paired master
    `owner(k)` (into its Qp), which passes it on to all other `masters`.

    `end`: the chunk where every member the stream has had reaches its `max_epochs`; no
    chunk from there on is decoded unless a later layout moves it (a join; it never moves
    back). None: unbounded.
    """

    stream: int
    version: int
    preprocessors: tuple[int, ...]
    masters: tuple[int, ...]
    end: int | None = None

    def owner(self, chunk: int) -> int:
        """The master paired with the preprocessor of `chunk` (the broadcast root)."""
        j = chunk % len(self.preprocessors)
        return self.masters[j % len(self.masters)]



@dataclass(frozen=True)
class StreamSource:
    """What a stream decodes: the order of samples, the chunk size, the base epoch key, with
    partitioned data the partition it visits (its members train one pass over it), and with
    grouped data the group its members train on (an epoch is that group's training samples)."""

    seed: int
    salt: int
    base_epoch: int
    chunk_samples: int
    partition: int | None = None
    group: str | None = None  # `data.group_by`: the group whose training samples it decodes


# ---------------------------------------------------------------- commands


@dataclass(frozen=True)
class StartMember:
    """Train `model` as one group of `ranks` (master first) on stream `layout.stream`."""

    model: str
    group_uid: int
    ranks: tuple[int, ...]
    layout: StreamLayout
    source: StreamSource
    first_chunk: int
    round: int
    resume: bool
    epoch_limit: int | None = None  # emulated device: converge after this many epochs
    next_stop: int | None = None  # early stopping: after this epoch the master waits for a `RungVerdict`
    asked: Any = None  # a search's asked model (a `ModelSpec`): its values, which the ranks' spec may lack


@dataclass(frozen=True)
class StartBundle:
    """Train `models` as one bundle (`fleet.engines.bundle`) on the one rank of `ranks`, on
    stream `layout.stream`; per model, as in `StartMember`: whether it resumes from its
    checkpoint, the emulated device's epoch limit and its next rung. `way`: ``fused`` or
    ``one_by_one`` (`fleet.schedule.bundle_ways.Way`); None: time both in its first steps and
    keep the faster (`runtime.fuse: auto`), telling the coordinator (`BundleDecided`)."""

    models: tuple[str, ...]
    group_uid: int
    ranks: tuple[int, ...]
    layout: StreamLayout
    source: StreamSource
    first_chunk: int
    round: int
    resume: tuple[bool, ...]
    epoch_limits: tuple[int | None, ...]
    next_stops: tuple[int | None, ...]
    way: str | None = "fused"

    def member(self, model: str) -> StartMember:
        """What a `StartMember` of `model` alone on the bundle's rank would say."""
        k = self.models.index(model)
        return StartMember(model, self.group_uid, self.ranks, self.layout, self.source, self.first_chunk, self.round,
                           self.resume[k], self.epoch_limits[k], self.next_stops[k])


@dataclass(frozen=True)
class Regroup:
    """From chunk `switch_chunk` on, the stream moves with `layout` (masters may join or leave)."""

    layout: StreamLayout
    switch_chunk: int


@dataclass(frozen=True)
class Pause:
    """Preprocessors: stop starting chunks of `stream`; reply with the next chunk index."""

    stream: int
    version: int


@dataclass(frozen=True)
class StartStream:
    """Preprocessors: decode `source` for `layout` from chunk 0."""

    layout: StreamLayout
    source: StreamSource


@dataclass(frozen=True)
class CheckpointModel:
    """Master: checkpoint `model` at the next step boundary and leave the stream; a bundle's
    master: checkpoint `models` (`model` first) at one step boundary, and they leave the bundle
    (at one position in their epochs: a later job bundles them again)."""

    model: str
    models: tuple[str, ...] = ()

    @property
    def ids(self) -> tuple[str, ...]:
        return self.models or (self.model,)


@dataclass(frozen=True)
class RungVerdict:
    """Master of `model`, waiting at the rung it reached (early stopping): train on
    (`go_on`, waiting next after epoch `next_stop`, None: never), or end here (stopped). A
    hold at the rung comes as a `CheckpointModel` instead."""

    model: str
    go_on: bool
    next_stop: int | None = None


@dataclass(frozen=True)
class Shutdown:
    """Every rank: the run is over (or aborted by a signal after its checkpoints)."""

    reason: str = "done"


@dataclass(frozen=True)
class KeepAlive:
    """Idle ranks: the coordinator is alive; keep waiting."""


# ---------------------------------------------------------------- reports


@dataclass(frozen=True)
class Paused:
    stream: int
    version: int
    rank: int
    next_chunk: int


@dataclass(frozen=True)
class EpochReport:
    """A model finished an epoch (reported by its master)."""

    model: str
    stream: int
    epoch: int
    train_loss: float
    val_loss: float
    val_accuracy: float
    samples_per_s: float  # the group's own compute rate (no waiting for data)
    stream_samples_per_s: float  # what the group actually consumed per second
    lr: float
    epoch_s: float
    checkpoint_s: float  # the master's saves since its last report (the epoch's checkpoint)
    stop_reason: str | None
    samples: int = 0  # the epoch's samples, resumed part included
    start_s: float = 0.0  # the member's start, from its StartMember to its first batch (first report only)
    cpu: tuple[float, float, int] = (0.0, 0.0, 0)  # the group's CPU seconds in steps, in all, samples trained
    val_samples: int = 0  # the samples it was validated on (its group's, with data.group_by)
    bundle: tuple[str, ...] = ()  # the models of the bundle it trained in (its rates are the bundle's), else ()
    end_s: float = 0.0  # the master's end of the epoch before this report: validation, save, best predictions (0: not timed)
    end_cpu_s: float = 0.0  # the master process's CPU seconds in that end
    waits: tuple[float, float] = (0.0, 0.0)  # the group's stream threads' waits for data: seconds, CPU seconds


@dataclass(frozen=True)
class BundleDecided:
    """A bundle's trial decided how it trains (`fleet.schedule.bundle_ways.WayDecision`'s fields:
    the median step seconds of each way, and the way kept, ``fused`` or ``one_by_one``)."""

    models: tuple[str, ...]
    stream: int
    fused_step_s: float
    one_by_one_step_s: float
    kept: str


@dataclass(frozen=True)
class Progress:
    """Heartbeat of a training model (also feeds the console)."""

    model: str
    epoch: int
    epoch_samples: int
    samples_per_s: float


@dataclass(frozen=True)
class MemberLeft:
    """A group left its stream: converged, or checkpointed on request."""

    model: str
    stream: int
    group_uid: int
    converged: bool
    epochs: int
    epoch_samples: int
    gpu_seconds: float
    checkpoint_s: float  # the master's saves since its last epoch report (the leave's checkpoint)
    parameters: int
    val_decoded: int = 0  # validation samples this rank decoded since its last report
    start_s: float = 0.0  # as in EpochReport, when no epoch report carried it
    visited: int | None = None  # partitioned data: the partition whose visit ended with this leave (a hop)
    cpu: tuple[float, float, int] = (0.0, 0.0, 0)  # as EpochReport's, of the epoch it leaves mid-way (this stint)
    compute_rate: float = 0.0  # samples/s its steps reached in that part of the epoch (0: none)
    waits: tuple[float, float] = (0.0, 0.0)  # as EpochReport's, of that part


@dataclass(frozen=True)
class VisitEnded:
    """A group passed over its partition (partitioned data) and hops: it saves its checkpoint
    next, and its `MemberLeft` follows. Told first, the driver sees the hop in flight as the
    simulator does (the model checkpointing on its GPUs) and can wait for them."""

    model: str
    stream: int
    epochs: int
    epoch_samples: int


@dataclass(frozen=True)
class EndNeeded:
    """A member resumed from an older checkpoint than the coordinator counted on (the newest
    was unusable): it needs its stream up to chunk `end`, past the layout's."""

    model: str
    stream: int
    end: int


@dataclass(frozen=True)
class StreamDone:
    """A preprocessor finished its part of a stream."""

    stream: int
    rank: int
    decoded: int
    shared: int = 0  # chunks its root master took from shared memory
    hollow: int = 0  # chunks sent as a header only, after every member had left
    read_from: tuple[tuple[str, int], ...] = ()  # (file, samples) this rank read for the stream
    cpu_s: float = 0.0  # CPU seconds of this rank's decoding loop since it began serving (all its streams, its waits)
    idle: tuple[float, float] = (0.0, 0.0)  # of them, its loop's rounds with nothing to do: seconds, CPU seconds
