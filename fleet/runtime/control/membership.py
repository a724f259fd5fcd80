"""Stream membership on rank 0: the policy's decisions as changes of who is in a stream.

A stream is decoded by its preprocessors and read by its groups' masters (`StreamLayout`).
Members join and leave a running stream only at a chunk boundary that every rank of the
stream agrees on: the coordinator asks the stream's preprocessors to pause (`Pause`), each
answers with the next chunk it would decode (`Paused`), and the switch is set past all of them
and past what the masters may already have posted receives for (`INBOX_DEPTH`). Then every old
master and preprocessor gets the new layout (`Regroup`) and joining groups get `StartMember`
from the switch on. A group joining on a rank whose group leaves at the same switch waits for
the next regroup (a rank is a stream's master once per layout); where that would leave the
stream without a master, the stream ends there and the waiting groups start a stream of their
own. A member resumed from an older checkpoint than expected claims a later end of its stream
(`EndNeeded`), which the next regroup sets. Starting streams and groups is the
`StreamStarter`'s (`fleet.runtime.control.starts`); the books are `StreamBooks`
(`fleet.runtime.control.streams`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from fleet.runtime.context import RunContext
from fleet.runtime.control.accounting import RunAccount
from fleet.runtime.control.console import Console
from fleet.runtime.control.fusing import BundleWays
from fleet.runtime.control.starts import Send, StreamStarter
from fleet.runtime.control.streams import Group, LiveStream, StreamBooks, visit_reads
from fleet.runtime.events import EventLog
from fleet.runtime.protocol import (
    INBOX_DEPTH,
    CheckpointModel,
    EndNeeded,
    MemberLeft,
    Pause,
    Paused,
    Regroup,
    RungVerdict,
    StreamDone,
    StreamLayout,
    Tag,
    stream_tag,
)
from fleet.schedule import Member
from fleet.schedule.ledger import Ledger


class Membership:
    """Who is in which stream, changed as the policy decides (see the module docstring): the
    driver's launches, joins, leaves and checkpoints become commands to the ranks, and the
    ranks' `Paused`, `EndNeeded`, `StreamDone` and `MemberLeft` reports move the changes on.
    Owned by the coordinator; it owns the `StreamBooks` and the `StreamStarter`.

    Args:
        ctx: the run (topology, spec, run directory, data facts).
        ledger: the run's books (stream ids, rounds, epochs done, rates).
        account: the run's results books (plan.json's members, records for a dropped join).
        send: how a command reaches a rank.
        log, console: the event log and the console.
        ways: how each bundle trains (`StreamStarter`'s).
    """

    def __init__(self, ctx: RunContext, ledger: Ledger, account: RunAccount, send: Send, log: EventLog,
                 console: Console, ways: BundleWays | None = None):
        self.ledger, self.account, self.send, self.log, self.console = ledger, account, send, log, console
        self.books = StreamBooks()
        self.starter = StreamStarter(ctx, ledger, self.books, send, log, console, ways)
        self.bundle_of: dict[str, str] = {}  # a model of a bundle -> the bundle's key (its first model)
        self.checkpoints_due: dict[str, tuple[int, list[str]]] = {}  # bundle key -> (its rank, models to checkpoint)

    @property
    def busy(self) -> bool:
        """Streams still running or groups not yet reported gone."""
        return self.books.busy

    @property
    def local_reports(self) -> deque:
        """Reports made here (a join dropped before it happened), for the coordinator to take first."""
        return self.books.local_reports

    @property
    def samples_decoded(self) -> int:
        return self.books.samples_decoded

    @property
    def chunks_shared(self) -> int:
        return self.books.chunks_shared

    # -- what the policy decided ------------------------------------------------------------

    def start_stream(self, stream_id: int, members: Sequence[Member], launching: int,
                     partition: int | None = None, own_decoding: bool = False) -> None:
        """A new stream of `members` (a model or a bundle each, on its GPUs); `launching`: new
        streams in this decision; `partition`: the partition its members visit (partitioned
        data); `own_decoding`: its master decodes it."""
        groups = [self._new_group(member, stream_id) for member in members]
        self.starter.open_stream(stream_id, groups, launching, partition, own_decoding)

    def join(self, stream_id: int, members: Sequence[Member]) -> None:
        """`members` join running stream `stream_id` at its next regroup."""
        live = self.books.streams[stream_id]
        live.joining.extend(self._new_group(member, stream_id) for member in members)
        self._request_change(live)

    def _new_group(self, member: Member, stream_id: int) -> Group:
        """The group of a member (a bundle's: keyed by its first model), recorded in the round's plan."""
        group = self.starter.new_group(member.model, member.gpus, member.models)
        for model in member.ids:
            self.account.record_member(model, member.gpus, stream_id)
            self.bundle_of.pop(model, None)
            if member.models:
                self.bundle_of[model] = member.model
        return group

    def checkpoint(self, model: str) -> None:
        """Checkpoint `model` and take it off its stream (a join not yet made is dropped); a
        model of a bundle leaves the bundle, which trains on with the others."""
        key = self.bundle_of.get(model, model)
        live = self.books.holding(key)
        if live is None:
            return  # leaving its stream already
        if key not in live.groups:
            self._cancel_join(live, key, model)
            return
        group = live.groups[key]
        if model in group.left:
            return  # it left its bundle already
        if group.models:
            self.checkpoints_due.setdefault(key, (group.ranks[0], []))[1].append(model)
        else:
            self.send(CheckpointModel(model), group.ranks[0], Tag.TRAINER)
        self.leave(live.layout.stream, model)

    def send_checkpoints(self) -> None:
        """The checkpoints of bundles' models asked since the last call, one command per bundle:
        the models a decision checkpoints leave their bundle at one step, at one position in
        their epochs, so that a later launch bundles them again. (Called by the coordinator
        before it waits for the next report.)"""
        for rank, models in self.checkpoints_due.values():
            self.send(CheckpointModel(models[0], tuple(models)), rank, Tag.TRAINER)
        self.checkpoints_due.clear()

    def verdict(self, model: str, verdict: RungVerdict) -> None:
        """Early stopping's verdict to the master of `model`, which waits at its rung."""
        key = self.bundle_of.get(model, model)
        live = self.books.holding(key)
        if live is not None and key in live.groups:
            self.send(verdict, live.groups[key].ranks[0], Tag.TRAINER)

    def leave(self, stream_id: int | None, model: str) -> None:
        """`model`'s group leaves its stream at the next regroup (converged or checkpointing);
        a bundle's, once its last model left it."""
        live = self.books.streams.get(stream_id) if stream_id is not None else None
        key = self.bundle_of.get(model, model)
        if live is None or key not in live.groups:
            return
        group = live.groups[key]
        group.left.add(model)
        if group.training:
            return  # the others train on in the bundle
        live.leaving.add(key)
        self._request_change(live)

    def _cancel_join(self, live: LiveStream, key: str, model: str) -> None:
        """A model whose join has not happened yet (the checkpoint signal, or an end of round,
        between the join and its regroup): the join is dropped (a bundle's once none of its
        models is left to start), and the model leaves as if it had checkpointed at once; its
        last checkpoint, if any, stays its state."""
        group = next(g for g in live.joining if g.model == key)
        if model in group.left:
            return  # dropped already
        group.left.add(model)
        if not group.training:
            live.joining.remove(group)
        self.account.rerecord({model}, live.layout.stream, None)
        record = self.account.records[model]
        self.books.groups_open += 1  # the report below closes it
        self.books.local_reports.append(MemberLeft(model, live.layout.stream, group.uid, False, record.epochs, 0,
                                                   record.gpu_seconds, 0.0, record.parameters))
        self.log.write("join_cancelled", model=model, stream=live.layout.stream)

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
        live = self.books.streams[reply.stream]
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
            ends = (self.starter.group_end(g, switch, live.source) for g in joining)
            end = max(end, live.claimed_end, *ends)
        live.layout = StreamLayout(old.stream, old.version + 1, old.preprocessors, masters, end)
        live.last_switch, live.pausing = switch, False
        self._send_regroup(old, Regroup(live.layout, switch), [g.model for g in joining])
        for group in joining:
            if switch > 0:
                self.account.joined(group.training)
            self.starter.start_group(live, group, first_chunk=switch)
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
        moved = [m for g in groups for m in g.training]
        for model in moved:
            self.ledger.move(model, stream_id)
        self.account.rerecord(set(moved), ended, stream_id)
        self.log.write("restream", ended=ended, stream=stream_id, members=sorted(moved))
        self.starter.open_stream(stream_id, groups, launching=1)

    def on_end_needed(self, claim: EndNeeded) -> None:
        """A member fell back to an older checkpoint: the next regroup moves the end for it."""
        live = self.books.streams.get(claim.stream)
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
        self.account.costs.stream_done(report)
        live = self.books.stream_done(report)
        if live is not None:
            self.log.write("stream_end", stream=report.stream, decoded=live.decoded, shared_chunks=live.shared,
                           hollow_chunks=live.hollow, **visit_reads(live))

    def on_left(self, report: MemberLeft) -> None:
        self.books.groups_open -= 1
