"""A stream's layouts as one master learns them: which layout holds at each chunk, and the
coordinator's `Regroup` commands that bring the new ones.

A layout (`StreamLayout`) names a stream's preprocessors and masters from a switch chunk on.
A master starts with its group's `StartMember`'s layout and learns each later one from a
`Regroup`, which reaches it on the stream's tag of the control communicator.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from fleet.runtime.protocol import Regroup, StreamLayout, stream_tag


@dataclass
class Version:
    first: int
    layout: StreamLayout
    _owned: dict = field(default_factory=dict)

    def owned(self, rank: int) -> frozenset[int]:
        """Indices j of the preprocessors paired with `rank` (it owns chunks k with k % P in them)."""
        if rank not in self._owned:
            masters, count = self.layout.masters, len(self.layout.preprocessors)
            self._owned[rank] = frozenset(j for j in range(count) if masters and masters[j % len(masters)] == rank)
        return self._owned[rank]

    def owned_chunks(self, rank: int, start: int, stop: int):
        """The chunks in [start, stop) whose root is `rank`."""
        p, owned = len(self.layout.preprocessors), self.owned(rank)
        return (k for k in range(start, stop) if k % p in owned)


class LayoutHistory:
    """The layouts of one stream that one master knows, each from the chunk it holds from (a
    `Version` each, oldest first): which holds at a chunk, where the stream ends as far as the
    master knows (ends only move forward), and whether the newest still has the master.
    Plain state: owned by the master's stream thread (`MasterStream`), which adds a layout
    for each `Regroup` it applies; its receives ask it which layout a chunk belongs to.

    Args:
        rank: the master's world rank.
        first: the chunk its group takes the stream from.
        layout: the layout of its group's `StartMember`.
    """

    def __init__(self, rank: int, first: int, layout: StreamLayout):
        self.rank = rank
        self.versions: list[Version] = [Version(first, layout)]

    @property
    def newest(self) -> StreamLayout:
        return self.versions[-1].layout

    def add(self, first: int, layout: StreamLayout) -> None:
        """A regroup's layout, which holds from chunk `first` on."""
        self.versions.append(Version(first, layout))

    def at(self, chunk: int) -> Version:
        """The version that holds at `chunk`."""
        for version in reversed(self.versions):
            if version.first <= chunk:
                return version
        raise LookupError(chunk)

    @property
    def end(self) -> float:
        """The stream's end as far as this master knows (the newest layout's)."""
        end = self.newest.end
        return float("inf") if end is None else end

    def at_end(self, chunk: int) -> bool:
        """True when `chunk` is at or past the stream's end: no such chunk comes."""
        return chunk >= self.end

    def stays(self) -> bool:
        """True while the newest layout still has this master: only then do later regroups
        concern it (a leaving master is not sent them)."""
        return self.rank in self.newest.masters


class RegroupBox:
    """The coordinator's Regroup commands that reached this rank, by stream, for all of the
    rank's stream threads to read. A rank can be a stream's master twice at once: the draining
    thread of a group that left, and the thread of a group that joined at a later regroup.
    Both read every Regroup sent here (each the ones newer than its newest), so neither can
    take, and drop, the one the other waits for (the regroup that tells the old thread it left).
    One per rank (`RunContext.regroups`, made by `regroup_box`)."""

    def __init__(self, ctrl: Any):
        self.ctrl = ctrl
        self.lock = threading.Lock()
        self.received: dict[int, list[Regroup]] = {}

    def after(self, stream: int, version: int) -> Regroup | None:
        """The oldest Regroup of `stream` newer than `version` that has reached this rank, or None."""
        with self.lock:
            while (message := self.ctrl.improbe(source=0, tag=stream_tag(stream))) is not None:
                command = message.recv()
                if isinstance(command, Regroup):
                    self.received.setdefault(stream, []).append(command)
            return next((c for c in self.received.get(stream, ()) if c.layout.version > version), None)


def regroup_box(ctx) -> RegroupBox:
    """The rank's one `RegroupBox` (`RunContext.regroups`), made at its first use."""
    if ctx.regroups is None:
        ctx.regroups = RegroupBox(ctx.ctrl)
    return ctx.regroups
