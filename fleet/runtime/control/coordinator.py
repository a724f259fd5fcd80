"""The coordinator (a thread of rank 0): drives the policy with what the ranks report.

It is the runtime's driver of the policy protocol (`fleet/schedule/_base.py`), beside the
simulator. Reports arrive as messages; each becomes a policy event; each decision becomes
commands: start a stream (preprocessors + groups), add or remove groups of a running stream
(a regroup at a chunk boundary), checkpoint a model. The books live in a `Ledger`.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any

from fleet.runtime.data.chunks import resumed_end_chunk
from fleet.runtime.control.console import Console
from fleet.runtime.context import RunContext
from fleet.runtime.events import EventLog
from fleet.runtime.protocol import (
    INBOX_DEPTH,
    CheckpointModel,
    EndNeeded,
    EpochReport,
    KeepAlive,
    MemberLeft,
    Pause,
    Paused,
    Progress,
    Regroup,
    Shutdown,
    StartMember,
    StartStream,
    StreamDone,
    StreamLayout,
    StreamSource,
    Tag,
    stream_tag,
)
from fleet.runtime.waiting import IDLE, WaitTimeout, send_object
from fleet.schedule import CheckpointCompleted, Decision, EpochCompleted, ModelConverged, ModelState, StreamPlan
from fleet.schedule.costs import Overheads
from fleet.schedule.ledger import Ledger
from fleet.schedule.rates import RateTable
from fleet.schedule.refine import RateRefiner, Refinement, makespan_simulator, rate_changes, weigh_refinement


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
    awaiting: dict[int, int] = field(default_factory=dict)  # preprocessor rank -> next chunk (None: pending)
    pausing: bool = False
    last_switch: int = 0
    claimed_end: int = 0  # the furthest end a member resumed from an older checkpoint needs
    done: set[int] = field(default_factory=set)
    decoded: int = 0
    shared: int = 0  # chunks its root masters took from shared memory
    hollow: int = 0  # chunks sent without samples after its last members left

    @property
    def ended(self) -> bool:
        return not self.layout.masters and self.done >= set(self.layout.preprocessors)

    @property
    def staying(self) -> bool:
        """True while the stream will still have masters once its pending changes are made."""
        joining = {g.model for g in self.joining}
        return bool(joining) or any(model not in self.leaving for model in self.groups)


@dataclass
class ModelRecord:
    """What the coordinator knows of one model, for results.json."""

    family: str
    parameters: int = 0
    epochs: int = 0
    history: list[dict] = field(default_factory=list)
    converged: bool = False
    stop_reason: str | None = None
    gpu_seconds: float = 0.0


def _subset(rates: RateTable, ids: list[str]) -> RateTable:
    return RateTable(tuple(rates.profile(i) for i in ids), rates.gpus_per_node, rates.samples_per_epoch, rates.extra)


class Coordinator:
    """See the module docstring. `run()` returns when every model has converged."""

    def __init__(self, ctx: RunContext, policy: Any, ledger: Ledger, records: dict, log: EventLog, console: Console,
                 make_policy: Any = None):
        self.ctx, self.policy, self.ledger, self.records = ctx, policy, ledger, records
        self.make_policy = make_policy or (lambda: policy)
        self.log, self.console = log, console
        self.topology = ctx.topology
        self.started = time.monotonic()
        self.streams: dict[int, LiveStream] = {}
        self.finished_streams: list[LiveStream] = []
        self.groups_started = 0
        self.groups_open = 0
        self.plan_rounds: list[dict] = []
        self.planning_s = 0.0
        self.checkpoint_s = 0.0  # masters' save seconds, summed over models
        self.checkpoint_gpu_s = 0.0  # the same, times each group's size: its trainers wait for the save
        self.val_decoded = 0
        self.last_keepalive = time.monotonic()
        self.checkpoint_signal = ctx.extras.get("checkpoint_signal")
        self.interrupted = False
        self.refiner = RateRefiner(ledger.rates)
        self.rejected: RateTable | None = None  # the last proposal weighed and not taken
        self.saves = 0  # checkpoints counted in checkpoint_s
        self.start_s, self.starts = 0.0, 0  # members' starts (StartMember to first batch), summed; counted
        self.local_reports: deque = deque()  # reports the coordinator makes itself (a cancelled join)

    @property
    def now(self) -> float:
        return time.monotonic() - self.started

    # -- the loop -----------------------------------------------------------------------------

    def run(self) -> None:
        self._decide(lambda view: self.policy.start(view))
        while (self.ledger.unfinished and not self.interrupted) or self.streams or self.groups_open:
            self._handle(self._next_report())
        self._broadcast_command(Shutdown("checkpointed" if self.interrupted else "done"))

    def _check_signal(self) -> None:
        """On the checkpoint signal: checkpoint every running model and start nothing new."""
        if self.interrupted or self.checkpoint_signal is None or not self.checkpoint_signal.is_set():
            return
        self.interrupted = True
        running = self.ledger.ids_in(ModelState.RUNNING)
        self.log.write("interrupted", at=self.now, running=running)
        self.console.banner(f"checkpoint signal: checkpointing {len(running)} running model(s), then exiting")
        for model in running:
            self._checkpoint(model)

    def _next_report(self) -> Any:
        deadline = time.monotonic() + self.ctx.timeout_s
        sleeps = IDLE.sleeps()
        while True:
            if self.local_reports:
                return self.local_reports.popleft()
            message = self.ctx.ctrl.improbe(tag=Tag.REPORT)
            if message is not None:
                return message.recv()
            self._check_signal()
            self._keepalive()
            if time.monotonic() > deadline:
                running = self.ledger.ids_in(ModelState.RUNNING, ModelState.CHECKPOINTING)
                raise WaitTimeout(
                    f"timed out after {self.ctx.timeout_s:g} s waiting for any report (running: {running[:5]})"
                )
            time.sleep(next(sleeps))

    def _keepalive(self) -> None:
        if time.monotonic() - self.last_keepalive > self.ctx.timeout_s / 4:
            self.last_keepalive = time.monotonic()
            self._broadcast_command(KeepAlive())

    def _broadcast_command(self, command: Any) -> None:
        for placement in self.topology.placements:
            tag = Tag.PREPROCESSOR if placement.gpu is None else Tag.TRAINER
            self._send(command, placement.rank, tag)

    def _send(self, command: Any, rank: int, tag: int) -> None:
        send_object(self.ctx.ctrl, command, rank, tag, f"rank {rank} to take a command", self.ctx.timeout_s)

    # -- reports -> events ----------------------------------------------------------------------

    def _handle(self, report: Any) -> None:
        if isinstance(report, EpochReport):
            self._on_epoch(report)
        elif isinstance(report, MemberLeft):
            self._on_left(report)
        elif isinstance(report, Paused):
            self._on_paused(report)
        elif isinstance(report, StreamDone):
            self._on_stream_done(report)
        elif isinstance(report, EndNeeded):
            self._on_end_needed(report)
        elif isinstance(report, Progress):
            pass  # a heartbeat: receiving it reset the deadline
        else:
            raise TypeError(f"coordinator got an unexpected report {report!r}")

    def _on_epoch(self, report: EpochReport) -> None:
        record = self.records[report.model]
        record.epochs = report.epoch
        record.history.append({k: v for k, v in report.__dict__.items() if k not in ("model", "stop_reason")})
        group_size = len(self.ledger.model(report.model).gpus)
        self._count_checkpoint(report.checkpoint_s, group_size)
        self._count_start(report.start_s)
        self.console.epoch(report.model, report.epoch, report.train_loss, report.val_accuracy,
                           report.samples_per_s, report.stream_samples_per_s)
        self.log.write("epoch", **report.__dict__)
        if group_size:
            self.refiner.observe(report.model, group_size, report.samples_per_s)
        self.ledger.epoch_done(report.model, report.epoch)
        if report.stop_reason is None:
            event = EpochCompleted(report.model, report.epoch, self.now, report.samples_per_s)
            self._decide(lambda view: self.policy.on_event(event, view))
            return
        record.converged, record.stop_reason = True, report.stop_reason
        stream = self.ledger.model(report.model).stream
        gpus = self.ledger.release(report.model, ModelState.CONVERGED)
        self._remove_group(stream, report.model)
        self.log.write("converged", model=report.model, epochs=report.epoch, reason=report.stop_reason)
        self.console.left(report.model, f"converged after {report.epoch} epochs ({report.stop_reason})")
        event = ModelConverged(report.model, report.epoch, self.now, gpus, report.samples_per_s)
        self._refine_rates()
        self._decide(lambda view: self.policy.on_event(event, view))

    def _on_left(self, report: MemberLeft) -> None:
        self.groups_open -= 1
        record = self.records[report.model]
        record.gpu_seconds = report.gpu_seconds
        record.parameters = report.parameters
        self.val_decoded += report.val_decoded
        self._count_start(report.start_s)
        self.log.write("member_left", **report.__dict__)
        if report.converged:
            return
        record.epochs = report.epochs
        self.ledger.epoch_done(report.model, report.epochs)
        gpus = self.ledger.release(report.model, ModelState.PAUSED)
        self._count_checkpoint(report.checkpoint_s, len(gpus))
        self.log.write("checkpoint", model=report.model, epochs=report.epochs, epoch_samples=report.epoch_samples)
        self.console.left(report.model, f"checkpointed at epoch {report.epochs} + {report.epoch_samples} samples")
        event = CheckpointCompleted(report.model, self.now, gpus)
        self._refine_rates()
        self._decide(lambda view: self.policy.on_event(event, view))

    def _count_start(self, seconds: float) -> None:
        if seconds > 0:
            self.start_s += seconds
            self.starts += 1

    def _count_checkpoint(self, seconds: float, group_size: int) -> None:
        self.checkpoint_s += seconds
        self.checkpoint_gpu_s += seconds * max(1, group_size)
        self.saves += seconds > 0

    # -- self-tuning rates ----------------------------------------------------------------------

    def _refine_rates(self) -> None:
        """Before the policy may plan: fold the measured rates in when the simulator predicts
        a gain above the cost of the change (see `fleet.schedule.refine`). A proposal within
        `MIN_CHANGE` of one already turned down is not weighed again. Nor are rates weighed
        while a policy that plans only on a drained cluster cannot plan."""
        if self.interrupted or not self.refiner.measured or not self.policy.uses_refined_rates:
            return
        if self.policy.plans_only_when_drained and not self.ledger.drained:
            return
        began = time.perf_counter()
        weighed = self._weigh_measured_rates()
        self.planning_s += time.perf_counter() - began
        if weighed is None:
            return
        proposal, verdict = weighed
        changes = verdict.changes
        shown = [{"model": c.model, "gpus": c.m, "old": round(c.old, 1), "new": round(c.new, 1)} for c in changes]
        self.log.write("rates_refined" if verdict.adopt else "rates_kept", changes=shown,
                       predicted_keep_s=verdict.predicted_keep_s, predicted_new_s=verdict.predicted_new_s,
                       gain_s=verdict.gain_s, cost_s=verdict.cost_s)
        worst = max(changes, key=lambda c: abs(c.relative))
        summary = (f"{len(changes)} rate(s) moved >= 10% (e.g. {worst.model} on {worst.m} GPU(s): {worst.old:,.0f} -> "
                   f"{worst.new:,.0f} samples/s); predicted gain {verdict.gain_s:.1f} s vs cost {verdict.cost_s:.1f} s")
        if verdict.adopt:
            self.ledger.rates = proposal
            self.rejected = None
            self.console.banner(f"rates refined: {summary}")
        else:
            self.rejected = proposal
            self.console.banner(f"rates kept: {summary}")

    def _weigh_measured_rates(self) -> tuple[RateTable, Refinement] | None:
        """(proposal, verdict) over the unfinished models, or None when there is nothing new to weigh."""
        current = self.ledger.rates
        proposal = self.refiner.propose(current)
        unfinished = [v for v in self.ledger.views if v.state is not ModelState.CONVERGED]
        if not unfinished or (self.rejected is not None and not rate_changes(self.rejected, proposal)):
            return None
        ids = [v.id for v in unfinished]
        old, new = _subset(current, ids), _subset(proposal, ids)
        if not rate_changes(old, new) or (self.policy.plans_only_when_drained and self._same_next_plan(proposal)):
            return None
        remaining = [max(1.0, v.epochs_estimate - v.epochs_done) for v in unfinished]
        costs = self._measured_overheads()
        simulate = makespan_simulator(self.make_policy, self.ledger.total_gpus, costs)
        verdict = weigh_refinement(old, new, remaining, simulate, costs.checkpoint_s(None) + costs.restore_s(None))
        return None if verdict is None else (proposal, verdict)

    def _same_next_plan(self, proposal: RateTable) -> bool:
        """Whether the plan about to be made on this drained cluster is the same on either
        table; then the proposal waits, at no loss, to be weighed before the next one."""
        view = self.ledger.view(self.now)
        plans = [self.make_policy().start(replace(view, rates=table)) for table in (view.rates, proposal)]
        return plans[0] == plans[1]

    def _measured_overheads(self) -> Overheads:
        """This run's costs, for the simulations that weigh a change of rates, and for the change
        itself (a moved model pays a checkpoint and a restore): a checkpoint or a restore takes
        the mean save so far (else 1 s), whatever the model's size, and every member's start
        the mean start so far (set-up and first data). Not the simulator's default, a cluster's
        5 s each, which made every extra round of a plan look 10 s dearer than it is."""
        each = self.checkpoint_s / self.saves if self.saves else 1.0
        start = self.start_s / self.starts if self.starts else 0.0
        return Overheads(latency_s=each, bandwidth=float("inf"), planning_s=0.0, start_s=start)

    # -- decisions -> commands --------------------------------------------------------------------

    def _decide(self, call) -> None:
        if self.interrupted:
            return  # winding down: the policy launches nothing more
        began = time.perf_counter()
        decision = call(self.ledger.view(self.now))
        self.planning_s += time.perf_counter() - began
        if not isinstance(decision, Decision):
            raise TypeError(f"{self.policy.name}: returned {decision!r}, not a Decision")
        targets = self.ledger.ids_in(ModelState.RUNNING) if decision.end_round else list(decision.checkpoint)
        if decision.end_round:
            self.log.write("round_end", index=self.ledger.round, at=self.now)
        for model in targets:
            self._checkpoint(model)
        if decision.launch:
            self._launch(decision.launch)
        if self.ledger.unfinished and self.ledger.drained and not decision.launch and not self._checkpointing():
            raise RuntimeError(f"{self.policy.name}: stalled with {self.ledger.unfinished} models left")

    def _checkpointing(self) -> bool:
        return bool(self.ledger.ids_in(ModelState.CHECKPOINTING))

    def _checkpoint(self, model: str) -> None:
        stream = self.ledger.model(model).stream
        live = self.streams[stream]
        if model not in live.groups:
            self._cancel_join(live, model)
            return
        group = live.groups[model]
        self.ledger.start_checkpoint(model)
        self._send(CheckpointModel(model), group.ranks[0], Tag.TRAINER)
        self._remove_group(stream, model)

    def _cancel_join(self, live: LiveStream, model: str) -> None:
        """Checkpoint a model whose join has not happened yet (the checkpoint signal, or an
        end of round, between the join and its regroup): the join is dropped, and the model
        leaves as if it had checkpointed at once; its last checkpoint, if any, stays its state."""
        group = next(g for g in live.joining if g.model == model)
        live.joining.remove(group)
        self._rerecord({model}, live.layout.stream, None)
        self.ledger.start_checkpoint(model)
        record = self.records[model]
        self.groups_open += 1  # `_on_left` closes it
        self.local_reports.append(MemberLeft(model, live.layout.stream, group.uid, False, record.epochs, 0,
                                             record.gpu_seconds, 0.0, record.parameters))
        self.log.write("join_cancelled", model=model, stream=live.layout.stream)

    def _launch(self, plans: tuple[StreamPlan, ...]) -> None:
        self.ledger.check_launch(plans, self.policy.name)
        if self.ledger.begin_launch():
            self.log.write("round_start", index=self.ledger.round, at=self.now)
            self.console.banner(f"round {self.ledger.round}")
            self.plan_rounds.append({"index": self.ledger.round, "members": []})
        new_streams = sum(plan.join is None for plan in plans)
        for plan in plans:
            if plan.join is None:
                self._start_stream(plan, new_streams)
            else:
                self._join(plan)

    def _group(self, model: str, gpus: tuple[int, ...]) -> Group:
        self.groups_started += 1
        ranks = tuple(self.topology.trainer_rank(g) for g in gpus)
        return Group(model, ranks, tuple(gpus), self.groups_started)

    def _start_stream(self, plan: StreamPlan, launching: int) -> None:
        stream_id = self.ledger.open_stream()
        self._open_stream(stream_id, [self._group(m.model, m.gpus) for m in plan.members], launching)

    def _open_stream(self, stream_id: int, groups: list[Group], launching: int) -> None:
        preprocessors = self._pick_preprocessors(groups, launching)
        source = self._source(stream_id, [g.model for g in groups])
        end = max(self._member_end(g.model, 0, source) for g in groups)
        layout = StreamLayout(stream_id, 0, preprocessors, tuple(g.ranks[0] for g in groups), end)
        live = LiveStream(layout, source, self.ledger.round)
        self.streams[stream_id] = live
        need = self._preprocessors_needed(groups)
        self.log.write("stream_start", stream=stream_id, members=[g.model for g in groups],
                       preprocessors=list(preprocessors), round=self.ledger.round, preprocessors_needed=need, end=end)
        if need is not None and need > len(preprocessors):
            self.console.banner(f"stream {stream_id} needs about {need} preprocessor(s) to keep its pace and has "
                                f"{len(preprocessors)}: its members may wait for data")
        for rank in preprocessors:
            self._send(StartStream(layout, source), rank, Tag.PREPROCESSOR)
        for group in groups:
            self._start_group(live, group, first_chunk=0)

    def _join(self, plan: StreamPlan) -> None:
        live = self.streams[plan.join]
        for member in plan.members:
            group = self._group(member.model, member.gpus)
            live.joining.append(group)
            self.ledger.reserve(group.model, group.gpus, live.layout.stream)
            self._record_member(group, live.layout.stream)
        self._request_change(live)

    def _start_group(self, live: LiveStream, group: Group, first_chunk: int) -> None:
        if group.model not in live.groups:
            live.groups[group.model] = group
        if self.ledger.model(group.model).state is not ModelState.RUNNING:
            self.ledger.reserve(group.model, group.gpus, live.layout.stream)
            self._record_member(group, live.layout.stream)
        resume = self._has_checkpoint(group.model)
        limit = self.ctx.extras.get("epoch_limits", {}).get(group.model)
        command = StartMember(group.model, group.uid, group.ranks, live.layout, live.source, first_chunk,
                              self.ledger.round, resume, limit)
        self.groups_open += 1
        for rank in group.ranks:
            self._send(command, rank, Tag.TRAINER)
        self.console.member(group.model, group.gpus, live.layout.stream, resume)
        self.log.write("member_start", model=group.model, stream=live.layout.stream, gpus=list(group.gpus),
                       ranks=list(group.ranks), first_chunk=first_chunk, resume=resume)

    def _record_member(self, group: Group, stream: int) -> None:
        self.plan_rounds[-1]["members"].append({"model": group.model, "gpus": list(group.gpus), "stream": stream})

    def _rerecord(self, models: set[str], stream: int, to: int | None) -> None:
        """Members of `models` recorded (by `_record_member`) in `stream` move to stream `to`,
        or are dropped (None): a join that became a stream of its own, or never happened."""
        members = self.plan_rounds[-1]["members"]
        for member in [m for m in members if m["model"] in models and m["stream"] == stream]:
            if to is None:
                members.remove(member)
            else:
                member["stream"] = to

    def _member_end(self, model: str, first_chunk: int, source: StreamSource) -> int:
        """The stream chunk after the one where `model`, taking the stream from `first_chunk`,
        ends its last epoch (`max_epochs`, or the emulated device's limit), counted from the
        checkpoint it resumes from: the same count as its master's `MemberClock`."""
        from fleet.runtime.train.checkpoint import CheckpointStore

        info = CheckpointStore(self.ctx.run_dir).latest_info(model)
        epochs, done = (int(info["epochs"]), int(info["epoch_samples"])) if info else (0, 0)
        limit = self.ctx.extras.get("epoch_limits", {}).get(model) or self.ctx.spec.model(model).train.max_epochs
        return resumed_end_chunk(first_chunk, limit, epochs, done, len(self.ctx.train_idx), source.chunk_samples)

    def _has_checkpoint(self, model: str) -> bool:
        from fleet.runtime.train.checkpoint import CheckpointStore

        return CheckpointStore(self.ctx.run_dir).latest_info(model) is not None

    def _source(self, stream_id: int, models: list[str]) -> StreamSource:
        import zlib

        base = min(self.ledger.model(m).epochs_done for m in models)
        salt = zlib.crc32(",".join(sorted(models)).encode()) & 0x7FFFFFFF
        return StreamSource(self.ctx.spec.seed, salt, base, self.ctx.chunk_samples)

    def _preprocessors_needed(self, groups: list[Group]) -> int | None:
        """Preprocessors that keep up with the stream's pace (its slowest member, at the current,
        possibly refined, rates), from the profile's decode throughput; None without one."""
        from profiler.document import decode_rates
        from profiler.plan import needed_preprocessors

        decode = decode_rates(self.ledger.rates.extra.get("preprocessing", {}))
        if not decode:
            return None
        pace = min(self.ledger.rates.rate(g.model, len(g.gpus)) for g in groups)
        return needed_preprocessors([pace], decode, nodes=1)

    def _pick_preprocessors(self, groups: list[Group], launching: int) -> tuple[int, ...]:
        """Least-loaded preprocessors, node-local first; a fair share of all of them.

        Streams that are only draining (every member has left) no longer count."""
        staying = [s for s in self.streams.values() if s.staying]
        load = {rank: sum(rank in s.layout.preprocessors for s in staying) for rank in self.topology.preprocessor_ranks()}
        share = max(1, len(load) // max(1, len(staying) + launching))
        nodes = {self.topology.node_of(g.ranks[0]) for g in groups}
        ranked = sorted(load, key=lambda r: (load[r], self.topology.node_of(r) not in nodes, r))
        return tuple(sorted(ranked[:share]))

    # -- membership changes (pause -> regroup) ------------------------------------------------------

    def _remove_group(self, stream_id: int | None, model: str) -> None:
        live = self.streams.get(stream_id) if stream_id is not None else None
        if live is None or model not in live.groups:
            return
        live.leaving.add(model)
        self._request_change(live)

    def _request_change(self, live: LiveStream) -> None:
        if live.pausing:
            return
        live.pausing = True
        live.awaiting = {rank: -1 for rank in live.layout.preprocessors}
        version = live.layout.version + 1
        for rank in live.layout.preprocessors:
            self._send(Pause(live.layout.stream, version), rank, Tag.PREPROCESSOR)

    def _on_paused(self, reply: Paused) -> None:
        live = self.streams[reply.stream]
        live.awaiting[reply.rank] = reply.next_chunk
        if min(live.awaiting.values()) < 0:
            return
        switch = max(max(live.awaiting.values()) + INBOX_DEPTH, live.last_switch + 1)
        if live.layout.end is not None:
            # nothing is decoded past the end, so no master has a receive posted there, and a
            # master that gets there waits for this regroup: the switch may be at the end
            switch = min(switch, live.layout.end)
        self._regroup(live, switch)

    def _regroup(self, live: LiveStream, switch: int) -> None:
        """Apply the pending leaves and joins at chunk `switch`. A group joining on a rank
        that is the master of a group leaving now joins at the next regroup: a rank is a
        stream's master once per layout (its leaving stream thread still takes the chunks
        before the switch, and would take the joining group's). Where that would leave the
        stream without a master, the stream ends here and the deferred groups start a stream
        of their own: a layout with no master ends a stream for its preprocessors."""
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
        command = Regroup(live.layout, switch)
        self.log.write("regroup", stream=old.stream, version=live.layout.version, switch=switch,
                       masters=list(masters), joined=[g.model for g in joining], end=end)
        for rank in old.masters:
            self._send(command, rank, stream_tag(old.stream))
        for rank in old.preprocessors:
            self._send(command, rank, Tag.PREPROCESSOR)
        for group in joining:
            self._start_group(live, group, first_chunk=switch)
        if live.leaving or live.joining:
            self._request_change(live)
        elif restream:
            self._restream(old.stream, deferred)

    def _on_end_needed(self, claim: EndNeeded) -> None:
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

    def _restream(self, ended: int, groups: list[Group]) -> None:
        """Start `groups`, which were to join stream `ended`, on a new stream."""
        stream_id = self.ledger.open_stream()
        moved = {g.model for g in groups}
        for group in groups:
            self.ledger.move(group.model, stream_id)
        self._rerecord(moved, ended, stream_id)
        self.log.write("restream", ended=ended, stream=stream_id, members=sorted(moved))
        self._open_stream(stream_id, groups, launching=1)

    def _on_stream_done(self, report: StreamDone) -> None:
        live = self.streams[report.stream]
        live.done.add(report.rank)
        live.decoded += report.decoded
        live.shared += report.shared
        live.hollow += report.hollow
        if live.ended:
            self.finished_streams.append(self.streams.pop(report.stream))
            self.log.write("stream_end", stream=report.stream, decoded=live.decoded, shared_chunks=live.shared,
                           hollow_chunks=live.hollow)

    # -- results --------------------------------------------------------------------------------------

    @property
    def samples_decoded(self) -> int:
        return sum(s.decoded for s in self.finished_streams)

    @property
    def chunks_shared(self) -> int:
        return sum(s.shared for s in self.finished_streams)
