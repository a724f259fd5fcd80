"""Stream membership on rank 0: starting streams and groups, and changing who is in a stream.

A stream is decoded by its preprocessors and read by its groups' masters (`StreamLayout`).
Members join and leave a running stream only at a chunk boundary that every rank of the
stream agrees on: the coordinator asks the stream's preprocessors to pause (`Pause`), each
answers with the next chunk it would decode (`Paused`), and the switch is set past all of them
and past what the masters may already have posted receives for (`INBOX_DEPTH`). Then every old
master and preprocessor gets the new layout (`Regroup`) and joining groups get `StartMember`
from the switch on. A group joining on a rank whose group leaves at the same switch waits for
the next regroup (a rank is a stream's master once per layout); where that would leave the
stream without a master, the stream ends there and the waiting groups start a stream of their
own. A stream's end chunk is where its last member ends its last epoch; a member resumed from
an older checkpoint than expected claims a later end (`EndNeeded`). A stream its one member
decodes itself (`own_decoding`, Baseline's) has that member's master as its only
preprocessor: the master rank's `OwnDecoder` takes the stream's commands.
"""

from __future__ import annotations

import zlib
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from fleet.runtime.context import RunContext
from fleet.runtime.control.accounting import RunAccount
from fleet.runtime.control.console import Console
from fleet.runtime.control.preprocessors import pick_preprocessors, preprocessors_needed
from fleet.runtime.data.chunks import resumed_end_chunk
from fleet.runtime.events import EventLog
from fleet.runtime.protocol import (
    INBOX_DEPTH,
    CheckpointModel,
    EndNeeded,
    MemberLeft,
    Pause,
    Paused,
    Regroup,
    StartMember,
    StartStream,
    StreamDone,
    StreamLayout,
    StreamSource,
    Tag,
    stream_tag,
)
from fleet.runtime.train.checkpoint import CheckpointStore
from fleet.schedule.ledger import Ledger

Send = Callable[[Any, int, int], None]  # (command, rank, tag)


@dataclass
class Group:
    model: str
    ranks: tuple[int, ...]
    gpus: tuple[int, ...]
    uid: int


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


def visit_reads(live: LiveStream) -> dict:
    """What a visit of partitioned data read, for its `stream_end` event: its partition and the
    samples each preprocessor read from each file (nothing for whole data)."""
    if live.source.partition is None:
        return {}
    return {"partition": live.source.partition,
            "read_from": {str(rank): files for rank, files in live.read_from.items()}}


class Membership:
    """Streams and their groups, as commands to the ranks; see the module docstring.

    Args:
        ctx: the run (topology, spec, run directory, data facts).
        ledger: the run's books (stream ids, rounds, epochs done, rates).
        account: the run's results books (plan.json's members, records for a dropped join).
        send: how a command reaches a rank.
        log, console: the event log and the console.
    """

    def __init__(self, ctx: RunContext, ledger: Ledger, account: RunAccount, send: Send, log: EventLog,
                 console: Console):
        self.ctx, self.ledger, self.account, self.send = ctx, ledger, account, send
        self.log, self.console = log, console
        self.topology = ctx.topology
        self.store = CheckpointStore(ctx.run_dir)
        self.streams: dict[int, LiveStream] = {}
        self.finished: list[LiveStream] = []
        self.groups_started = 0
        self.groups_open = 0
        self.local_reports: deque = deque()  # reports made here (a join dropped before it happened)

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

    # -- what the policy decided ------------------------------------------------------------

    def start_stream(self, stream_id: int, members: Sequence[tuple[str, tuple[int, ...]]], launching: int,
                     partition: int | None = None, own_decoding: bool = False) -> None:
        """A new stream of `members` ((model, GPUs)); `launching`: new streams in this decision;
        `partition`: the partition its members visit (partitioned data); `own_decoding`: its master decodes it."""
        groups = [self._group(model, gpus) for model, gpus in members]
        for group in groups:
            self.account.record_member(group.model, group.gpus, stream_id)
        self._open_stream(stream_id, groups, launching, partition, own_decoding)

    def join(self, stream_id: int, members: Sequence[tuple[str, tuple[int, ...]]]) -> None:
        """`members` join running stream `stream_id` at its next regroup."""
        live = self.streams[stream_id]
        for model, gpus in members:
            group = self._group(model, gpus)
            live.joining.append(group)
            self.account.record_member(model, gpus, stream_id)
        self._request_change(live)

    def checkpoint(self, model: str) -> None:
        """Checkpoint `model` and take it off its stream (a join not yet made is dropped)."""
        live = next((s for s in self.streams.values() if s.holds(model)), None)
        if live is None:
            return  # leaving its stream already
        if model not in live.groups:
            self._cancel_join(live, model)
            return
        self.send(CheckpointModel(model), live.groups[model].ranks[0], Tag.TRAINER)
        self.leave(live.layout.stream, model)

    def leave(self, stream_id: int | None, model: str) -> None:
        """`model`'s group leaves its stream at the next regroup (converged or checkpointing)."""
        live = self.streams.get(stream_id) if stream_id is not None else None
        if live is None or model not in live.groups:
            return
        live.leaving.add(model)
        self._request_change(live)

    def _cancel_join(self, live: LiveStream, model: str) -> None:
        """A model whose join has not happened yet (the checkpoint signal, or an end of round,
        between the join and its regroup): the join is dropped, and the model leaves as if it
        had checkpointed at once; its last checkpoint, if any, stays its state."""
        group = next(g for g in live.joining if g.model == model)
        live.joining.remove(group)
        self.account.rerecord({model}, live.layout.stream, None)
        record = self.account.records[model]
        self.groups_open += 1  # the report below closes it
        self.local_reports.append(MemberLeft(model, live.layout.stream, group.uid, False, record.epochs, 0,
                                             record.gpu_seconds, 0.0, record.parameters))
        self.log.write("join_cancelled", model=model, stream=live.layout.stream)

    # -- starting streams and groups ----------------------------------------------------------

    def _group(self, model: str, gpus: tuple[int, ...]) -> Group:
        self.groups_started += 1
        ranks = tuple(self.topology.trainer_rank(g) for g in gpus)
        return Group(model, ranks, tuple(gpus), self.groups_started)

    def _open_stream(self, stream_id: int, groups: list[Group], launching: int, partition: int | None = None,
                     own_decoding: bool = False) -> None:
        staying = [s.layout.preprocessors for s in self.streams.values() if s.staying]
        nodes = None if partition is None else self._nodes_of(partition)
        masters = tuple(g.ranks[0] for g in groups)
        preprocessors = masters if own_decoding else pick_preprocessors(self.topology, staying, masters, launching, nodes)
        source = self._source([g.model for g in groups], partition)
        end = max(self._member_end(g.model, 0, source) for g in groups)
        layout = StreamLayout(stream_id, 0, preprocessors, masters, end)
        live = self.streams[stream_id] = LiveStream(layout, source, self.ledger.round)
        need = None if own_decoding else preprocessors_needed(self.ledger.rates, [(g.model, len(g.gpus)) for g in groups])
        self.log.write("stream_start", stream=stream_id, members=[g.model for g in groups],
                       preprocessors=list(preprocessors), round=self.ledger.round, preprocessors_needed=need, end=end,
                       partition=partition, own_decoding=own_decoding)
        if need is not None and need > len(preprocessors):
            self.console.banner(f"stream {stream_id} needs about {need} preprocessor(s) to keep its pace and has "
                                f"{len(preprocessors)}: its members may wait for data")
        for rank in preprocessors:
            self.send(StartStream(layout, source), rank, Tag.PREPROCESSOR)
        self.console.shared_stream(stream_id, [g.model for g in groups])
        for group in groups:
            self._start_group(live, group, first_chunk=0)

    def _start_group(self, live: LiveStream, group: Group, first_chunk: int) -> None:
        live.groups.setdefault(group.model, group)
        resume = self.store.latest_info(group.model) is not None
        limit = self.ctx.epoch_limits.get(group.model)
        command = StartMember(group.model, group.uid, group.ranks, live.layout, live.source, first_chunk,
                              self.ledger.round, resume, limit)
        self.groups_open += 1
        for rank in group.ranks:
            self.send(command, rank, Tag.TRAINER)
        self.console.member(group.model, group.gpus, live.layout.stream, resume)
        self.log.write("member_start", model=group.model, stream=live.layout.stream, gpus=list(group.gpus),
                       ranks=list(group.ranks), first_chunk=first_chunk, resume=resume)

    def _member_end(self, model: str, first_chunk: int, source: StreamSource) -> int:
        """The stream chunk after the one where `model`, taking the stream from `first_chunk`,
        ends its last epoch (`max_epochs`, or the emulated device's limit), counted from the
        checkpoint it resumes from: the same count as its master's `MemberClock`. A visit of a
        partition ends after one pass over it."""
        if source.partition is not None:
            visited = int(self.ctx.partitions.sizes[source.partition])
            return resumed_end_chunk(first_chunk, 1, 0, 0, visited, source.chunk_samples)
        info = self.store.latest_info(model)
        epochs, done = (int(info["epochs"]), int(info["epoch_samples"])) if info else (0, 0)
        limit = self.ctx.epoch_limits.get(model) or self.ctx.spec.model(model).train.max_epochs
        return resumed_end_chunk(first_chunk, limit, epochs, done, len(self.ctx.train_idx), source.chunk_samples)

    def _source(self, models: list[str], partition: int | None = None) -> StreamSource:
        base = min(self.ledger.model(m).epochs_done for m in models)
        salt = zlib.crc32(",".join(sorted(models)).encode()) & 0x7FFFFFFF
        return StreamSource(self.ctx.spec.seed, salt, base, self.ctx.chunk_samples, partition)

    def _nodes_of(self, partition: int) -> list[int]:
        per = self.ctx.partitions.nodes_each
        return list(range(partition * per, (partition + 1) * per))

    # -- membership changes (pause -> regroup) ------------------------------------------------

    def _request_change(self, live: LiveStream) -> None:
        if live.pausing:
            return
        live.pausing = True
        live.awaiting = {rank: -1 for rank in live.layout.preprocessors}
        version = live.layout.version + 1
        for rank in live.layout.preprocessors:
            self.send(Pause(live.layout.stream, version), rank, Tag.PREPROCESSOR)

    def on_paused(self, reply: Paused) -> None:
        live = self.streams[reply.stream]
        live.awaiting[reply.rank] = reply.next_chunk
        if min(live.awaiting.values()) < 0:
            return
        switch = max(max(live.awaiting.values()) + INBOX_DEPTH, live.last_switch + 1)
        if live.layout.end is not None:
            # nothing is decoded past the end, so no master has a receive posted there, and a
            # master that gets there waits for this regroup: the switch may be at the end
            switch = min(switch, live.layout.end)
        self.regroup(live, switch)

    def regroup(self, live: LiveStream, switch: int) -> None:
        """Apply the pending leaves and joins at chunk `switch` (see the module docstring)."""
        old = live.layout
        leaving_masters = {live.groups[m].ranks[0] for m in live.leaving if m in live.groups}
        for model in live.leaving:
            live.groups.pop(model, None)
        joining = [g for g in live.joining if g.ranks[0] not in leaving_masters]
        deferred = [g for g in live.joining if g.ranks[0] in leaving_masters]
        restream = bool(deferred) and not live.groups and not joining  # the new layout would have no master
        live.joining = [] if restream else deferred
        live.leaving = set()
        for group in joining:
            live.groups[group.model] = group
        masters = tuple(g.ranks[0] for g in live.groups.values())
        end = old.end
        if end is not None:
            end = max(end, live.claimed_end, *(self._member_end(g.model, switch, live.source) for g in joining))
        live.layout = StreamLayout(old.stream, old.version + 1, old.preprocessors, masters, end)
        live.last_switch, live.pausing = switch, False
        self._send_regroup(old, Regroup(live.layout, switch), [g.model for g in joining])
        for group in joining:
            self._start_group(live, group, first_chunk=switch)
        if live.leaving or live.joining:
            self._request_change(live)
        elif restream:
            self._restream(old.stream, deferred)

    def _send_regroup(self, old: StreamLayout, command: Regroup, joined: list[str]) -> None:
        new = command.layout
        self.log.write("regroup", stream=old.stream, version=new.version, switch=command.switch_chunk,
                       masters=list(new.masters), joined=joined, end=new.end)
        for rank in old.masters:
            self.send(command, rank, stream_tag(old.stream))
        for rank in old.preprocessors:
            self.send(command, rank, Tag.PREPROCESSOR)

    def _restream(self, ended: int, groups: list[Group]) -> None:
        """Start `groups`, which were to join stream `ended`, on a new stream."""
        stream_id = self.ledger.open_stream()
        moved = {g.model for g in groups}
        for group in groups:
            self.ledger.move(group.model, stream_id)
        self.account.rerecord(moved, ended, stream_id)
        self.log.write("restream", ended=ended, stream=stream_id, members=sorted(moved))
        self._open_stream(stream_id, groups, launching=1)

    def on_end_needed(self, claim: EndNeeded) -> None:
        """A member fell back to an older checkpoint: the next regroup moves the end for it."""
        live = self.streams.get(claim.stream)
        if (live is None or claim.model not in live.groups or claim.model in live.leaving or live.layout.end is None
                or claim.end <= live.layout.end):
            return  # the member is leaving (or left) anyway, or the end is already far enough
        live.claimed_end = max(live.claimed_end, claim.end)
        self.log.write("end_needed", model=claim.model, stream=claim.stream, end=claim.end, was=live.layout.end)
        self.console.banner(f"{claim.model} resumed from an older checkpoint than its newest: stream {claim.stream} "
                            f"now ends at chunk {claim.end} (was {live.layout.end})")
        self._request_change(live)

    # -- streams and groups that ended ----------------------------------------------------------

    def on_stream_done(self, report: StreamDone) -> None:
        live = self.streams[report.stream]
        live.done.add(report.rank)
        live.decoded += report.decoded
        live.shared += report.shared
        live.hollow += report.hollow
        live.read_from[report.rank] = dict(report.read_from)
        if live.ended:
            self.finished.append(self.streams.pop(report.stream))
            self.log.write("stream_end", stream=report.stream, decoded=live.decoded, shared_chunks=live.shared,
                           hollow_chunks=live.hollow, **visit_reads(live))

    def on_left(self, report: MemberLeft) -> None:
        self.groups_open -= 1
