"""The coordinator's books on its streams: each running stream's layout and pending changes,
the streams that ended, and the groups not yet reported gone.

Plain records, no messages: `Membership` (`fleet.runtime.control.membership`) keeps them as
its commands go out and the ranks' reports come in.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from fleet.runtime.protocol import StreamDone, StreamLayout, StreamSource


@dataclass
class Group:
    """The trainers of one model, or of a bundle (`models`; `model`, its first, is its key in
    its stream's books), and the models of a bundle that left it while the others train on."""

    model: str
    ranks: tuple[int, ...]
    gpus: tuple[int, ...]
    uid: int
    models: tuple[str, ...] = ()
    left: set[str] = field(default_factory=set)

    @property
    def ids(self) -> tuple[str, ...]:
        """The models it trains: a bundle's, or its one model."""
        return self.models or (self.model,)

    @property
    def training(self) -> tuple[str, ...]:
        """Its models that have not left it."""
        return tuple(m for m in self.ids if m not in self.left)


@dataclass
class LiveStream:
    """The coordinator's view of one running stream and its pending membership changes."""

    layout: StreamLayout
    source: StreamSource
    round: int
    groups: dict[str, Group] = field(default_factory=dict)
    joining: list[Group] = field(default_factory=list)
    leaving: set[str] = field(default_factory=set)
    awaiting: dict[int, int] = field(default_factory=dict)  # preprocessor rank -> next chunk (-1: pending)
    pausing: bool = False
    last_switch: int = 0
    claimed_end: int = 0  # the furthest end a member resumed from an older checkpoint needs
    done: set[int] = field(default_factory=set)
    decoded: int = 0
    shared: int = 0  # chunks its root masters took from shared memory
    hollow: int = 0  # chunks sent without samples after its last members left
    read_from: dict[int, dict[str, int]] = field(default_factory=dict)  # preprocessor rank -> samples per file

    @property
    def ended(self) -> bool:
        return not self.layout.masters and self.done >= set(self.layout.preprocessors)

    @property
    def staying(self) -> bool:
        """True while the stream will still have masters once its pending changes are made."""
        joining = {g.model for g in self.joining}
        return bool(joining) or any(model not in self.leaving for model in self.groups)

    def holds(self, model: str) -> bool:
        """True while `model` is in this stream or joins it, and is not leaving it already: a
        model checkpointed at a round's end may be in a new stream while its old one still
        waits for the regroup that takes it out."""
        in_it = model in self.groups and model not in self.leaving
        return in_it or any(g.model == model for g in self.joining)

    def preprocessor_done(self, report: StreamDone) -> None:
        """One of its preprocessors finished its part: what it decoded, shared and read."""
        self.done.add(report.rank)
        self.decoded += report.decoded
        self.shared += report.shared
        self.hollow += report.hollow
        self.read_from[report.rank] = dict(report.read_from)


def visit_reads(live: LiveStream) -> dict:
    """What a visit of partitioned data read, for its `stream_end` event: its partition and the
    samples each preprocessor read from each file (nothing for whole data)."""
    if live.source.partition is None:
        return {}
    return {"partition": live.source.partition,
            "read_from": {str(rank): files for rank, files in live.read_from.items()}}


class StreamBooks:
    """The streams running (a `LiveStream` each, by id) and ended, and the count of groups
    started and not yet reported gone (each `StartMember` opens one, each `MemberLeft` closes
    it). Owned by `Membership`, which books its commands and the ranks' reports here; the
    coordinator runs while the books are `busy`, and results.json reports their totals.

    Attributes:
        local_reports: reports made on rank 0 itself (the `MemberLeft` of a join dropped
            before it happened), which the coordinator takes before the ranks' reports.
    """

    def __init__(self):
        self.streams: dict[int, LiveStream] = {}
        self.finished: list[LiveStream] = []
        self.groups_open = 0
        self.local_reports: deque = deque()

    @property
    def busy(self) -> bool:
        """Streams still running or groups not yet reported gone."""
        return bool(self.streams) or self.groups_open > 0

    @property
    def samples_decoded(self) -> int:
        return sum(s.decoded for s in self.finished)

    @property
    def chunks_shared(self) -> int:
        return sum(s.shared for s in self.finished)

    def holding(self, model: str) -> LiveStream | None:
        """The stream `model` is in or joins and is not leaving yet (see `LiveStream.holds`)."""
        return next((s for s in self.streams.values() if s.holds(model)), None)

    def staying_preprocessors(self) -> list[tuple[int, ...]]:
        """The preprocessors of each stream that keeps masters once its pending changes are made."""
        return [s.layout.preprocessors for s in self.streams.values() if s.staying]

    def stream_done(self, report: StreamDone) -> LiveStream | None:
        """Book a preprocessor's end of a stream; returns the stream once it has ended (every
        preprocessor done and no master left), moved to `finished`."""
        live = self.streams[report.stream]
        live.preprocessor_done(report)
        if not live.ended:
            return None
        self.finished.append(self.streams.pop(report.stream))
        return live
