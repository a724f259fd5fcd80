"""Starting streams and groups on rank 0: a new stream's preprocessors, source and end chunk,
and the commands that start it (`StartStream`) and each of its groups (`StartMember`).

A stream's end chunk is where its last member ends its last epoch, counted from the
checkpoint each resumes from; a member resumed from an older checkpoint than expected claims a
later end (`EndNeeded`, handled by `Membership`). A stream its one member decodes itself
(`own_decoding`, Baseline's) has that member's master as its only preprocessor: the master
rank's `OwnDecoder` takes the stream's commands.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Any

from fleet.engines.fusion import fusion_text
from fleet.runtime.context import RunContext
from fleet.runtime.control.console import Console
from fleet.runtime.control.fusing import BundleWays
from fleet.runtime.control.preprocessors import pick_preprocessors, preprocessors_needed
from fleet.runtime.control.streams import Group, LiveStream, StreamBooks
from fleet.runtime.data.chunks import resumed_end_chunk
from fleet.runtime.events import EventLog
from fleet.runtime.protocol import StartBundle, StartMember, StartStream, StreamLayout, StreamSource, Tag
from fleet.runtime.train.checkpoint import CheckpointStore
from fleet.schedule.ledger import Ledger
from fleet.spec import Spec

Send = Callable[[Any, int, int], None]  # (command, rank, tag)


def stream_group(spec: Spec, models: list[str], expected: str | None = None) -> str | None:
    """The one group of data `models` train on (None without `data.group_by`); `expected`:
    the group of the stream they join.

    Raises:
        RuntimeError: a plan put models of two groups in one stream (the spec lets only
            policies run grouped models that never do).
    """
    groups = {spec.model(m).group for m in models}
    if len(groups) > 1 or (expected is not None and groups != {expected}):
        raise RuntimeError(f"models {', '.join(models)} would share a stream across groups "
                           f"({', '.join(sorted(map(str, groups | {expected} - {None})))})")
    return groups.pop()


class StreamStarter:
    """Starts streams and groups (see the module docstring); a group that joins a running
    stream is started here too, from its switch chunk. Owned by `Membership`, which decides
    what starts when; what it starts it books in the `StreamBooks`.

    Args:
        ctx: the run (topology, spec, run directory, data facts, the emulated epoch limits).
        ledger: the run's books (rounds, epochs done, rates).
        books: the coordinator's streams, where new streams and groups are booked.
        send: how a command reaches a rank.
        log, console: the event log and the console.
        ways: how each bundle trains (default: as `runtime.fuse` says, nothing decided yet).
    """

    def __init__(self, ctx: RunContext, ledger: Ledger, books: StreamBooks, send: Send, log: EventLog,
                 console: Console, ways: BundleWays | None = None):
        self.ctx, self.ledger, self.books, self.send = ctx, ledger, books, send
        self.log, self.console = log, console
        self.ways = ways if ways is not None else BundleWays(ctx.spec, (), log, console)
        self.topology = ctx.topology
        self.store = CheckpointStore(ctx.run_dir)
        self.groups_started = 0

    def new_group(self, model: str, gpus: tuple[int, ...], models: tuple[str, ...] = ()) -> Group:
        """The group of trainers of `gpus` for `model` (or for a bundle of `models`, `model` its
        first), with the next group id."""
        self.groups_started += 1
        ranks = tuple(self.topology.trainer_rank(g) for g in gpus)
        return Group(model, ranks, tuple(gpus), self.groups_started, tuple(models))

    def open_stream(self, stream_id: int, groups: list[Group], launching: int, partition: int | None = None,
                    own_decoding: bool = False) -> None:
        """Start stream `stream_id` and its `groups` (`launching`: new streams in this decision;
        `partition`: the partition its members visit; `own_decoding`: its master decodes it)."""
        nodes = None if partition is None else self._nodes_of(partition)
        masters = tuple(g.ranks[0] for g in groups)
        preprocessors = masters if own_decoding else pick_preprocessors(
            self.topology, self.books.staying_preprocessors(), masters, launching, nodes)
        models = [m for g in groups for m in g.training]
        source = self._source(models, partition)
        end = max(self.group_end(g, 0, source) for g in groups)
        layout = StreamLayout(stream_id, 0, preprocessors, masters, end)
        live = self.books.streams[stream_id] = LiveStream(layout, source, self.ledger.round)
        need = None if own_decoding else preprocessors_needed(self.ledger.rates, [(g.training, len(g.gpus))
                                                                                  for g in groups])
        self.log.write("stream_start", stream=stream_id, members=models,
                       preprocessors=list(preprocessors), round=self.ledger.round, preprocessors_needed=need, end=end,
                       partition=partition, own_decoding=own_decoding)
        if need is not None and need > len(preprocessors):
            self.console.banner(f"stream {stream_id} needs about {need} preprocessor(s) to keep its pace and has "
                                f"{len(preprocessors)}: its members may wait for data")
        for rank in preprocessors:
            self.send(StartStream(layout, source), rank, Tag.PREPROCESSOR)
        self.console.shared_stream(stream_id, models)
        for group in groups:
            self.start_group(live, group, first_chunk=0)

    def start_group(self, live: LiveStream, group: Group, first_chunk: int) -> None:
        """`StartMember` to every rank of `group` (`StartBundle` to a bundle's one rank), which
        takes stream `live` from `first_chunk`."""
        stream_group(self.ctx.spec, list(group.ids), live.source.group)
        live.groups.setdefault(group.model, group)
        if group.models:
            self._start_bundle(live, group, first_chunk)
            return
        resume = self.store.latest_info(group.model) is not None
        limit = self.ctx.epoch_limits.get(group.model)
        model = self.ctx.spec.model(group.model)
        command = StartMember(group.model, group.uid, group.ranks, live.layout, live.source, first_chunk,
                              self.ledger.round, resume, limit, self.ledger.model(group.model).next_stop,
                              model if model.search is not None else None)
        self.books.groups_open += 1
        for rank in group.ranks:
            self.send(command, rank, Tag.TRAINER)
        self.console.member(group.model, group.gpus, live.layout.stream, resume)
        self.log.write("member_start", model=group.model, stream=live.layout.stream, gpus=list(group.gpus),
                       ranks=list(group.ranks), first_chunk=first_chunk, resume=resume)

    def _start_bundle(self, live: LiveStream, group: Group, first_chunk: int) -> None:
        """`StartBundle` to the bundle's rank, for its models that have not left it (a join
        dropped for some of them before it happened); a `member_start` for each model."""
        models = group.training
        resume = tuple(self.store.latest_info(m) is not None for m in models)
        way = self.ways.way(models)
        command = StartBundle(models, group.uid, group.ranks, live.layout, live.source, first_chunk, self.ledger.round,
                              resume, tuple(self.ctx.epoch_limits.get(m) for m in models),
                              tuple(self.ledger.model(m).next_stop for m in models), way)
        self.books.groups_open += len(models)  # each model's leave report closes one
        for rank in group.ranks:
            self.send(command, rank, Tag.TRAINER)
        key = fusion_text(self.ctx.spec.model(models[0]))
        self.log.write("bundle_formed", models=list(models), key=key, stream=live.layout.stream, gpus=list(group.gpus),
                       way=way)
        self.console.bundle(models, group.gpus, key, way)
        for model, resumed in zip(models, resume):
            self.console.member(model, group.gpus, live.layout.stream, resumed)
            self.log.write("member_start", model=model, stream=live.layout.stream, gpus=list(group.gpus),
                           ranks=list(group.ranks), first_chunk=first_chunk, resume=resumed, bundle=list(models))

    def group_end(self, group: Group, first_chunk: int, source: StreamSource) -> int:
        """`member_end` of the group's model, or the furthest of a bundle's models."""
        return max(self.member_end(m, first_chunk, source) for m in group.training)

    def member_end(self, model: str, first_chunk: int, source: StreamSource) -> int:
        """The stream chunk after the one where `model`, taking the stream from `first_chunk`,
        ends its last epoch (`max_epochs`, or the emulated device's limit), counted from the
        checkpoint it resumes from: the same count as its master's `MemberClock`. A visit of a
        partition ends after one pass over it."""
        if source.partition is not None:
            visited = int(self.ctx.partitions.pass_samples(source.group, source.partition))
            return resumed_end_chunk(first_chunk, 1, 0, 0, visited, source.chunk_samples)
        info = self.store.latest_info(model)
        epochs, done = (int(info["epochs"]), int(info["epoch_samples"])) if info else (0, 0)
        limit = self.ctx.epoch_limits.get(model) or self.ctx.spec.model(model).train.max_epochs
        return resumed_end_chunk(first_chunk, limit, epochs, done, len(self.ctx.train_idx_of(source.group)),
                                 source.chunk_samples)

    def _source(self, models: list[str], partition: int | None = None) -> StreamSource:
        base = min(self.ledger.model(m).epochs_done for m in models)
        salt = zlib.crc32(",".join(sorted(models)).encode()) & 0x7FFFFFFF
        return StreamSource(self.ctx.spec.seed, salt, base, self.ctx.chunk_samples, partition,
                            stream_group(self.ctx.spec, models))

    def _nodes_of(self, partition: int) -> list[int]:
        per = self.ctx.partitions.nodes_each
        return list(range(partition * per, (partition + 1) * per))
