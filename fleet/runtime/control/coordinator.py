"""The coordinator (a thread of rank 0): the runtime's world for the policy driver.

The policy runs in a `fleet.schedule.driver.Driver`, the same driver the simulator uses. The
coordinator supplies what the runtime knows and does: reports from the ranks (messages)
become the driver's events, in real time; the driver's decisions become commands, through
`Membership` (streams, groups, regroups). Measured rates are weighed by the driver's adapter
before the policy plans (`fleet.schedule.adapting`, told to an `AdaptLog`); results are kept
by a `RunAccount`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleet.report.results import EARLY_STOP_REASON
from fleet.report.tensorboard import ScalarBoard
from fleet.runtime.context import RunContext
from fleet.runtime.control.accounting import ModelRecord, RunAccount
from fleet.runtime.control.console import Console
from fleet.runtime.control.fusing import BundleWays
from fleet.runtime.control.host_use import HostUse
from fleet.runtime.control.membership import Membership
from fleet.runtime.control.rungs import RungLog
from fleet.runtime.control.search import RunSearch
from fleet.runtime.control.tuning import AdaptLog
from fleet.runtime.control.visits import VisitLog, recover_visits
from fleet.runtime.events import EventLog
from fleet.runtime.protocol import (
    BundleDecided,
    EndNeeded,
    EpochReport,
    KeepAlive,
    MemberLeft,
    Paused,
    Progress,
    RungVerdict,
    Shutdown,
    StreamDone,
    Tag,
    VisitEnded,
)
from fleet.runtime.waiting import IDLE, WaitTimeout, send_object
from fleet.schedule import ClusterView, ModelState, Policy
from fleet.schedule.adapting import Adapter, PolicyReconsider, RateTuner
from fleet.schedule.choice import PolicySwitch
from fleet.schedule.costs import Overheads
from fleet.schedule.driver import Driver, Launch
from fleet.schedule.early_stop import EarlyStopping, RungDecision, Verdict
from fleet.schedule.ledger import Ledger, describe_books
from fleet.spec import Device


@dataclass(frozen=True)
class EarlyStopped:
    """A report made on rank 0: early stopping stopped `model` after `epochs` (the driver hears
    it once the decision that stopped it is carried out)."""

    model: str
    epochs: int
    samples_per_s: float


def epoch_fields(report: EpochReport) -> dict:
    """An epoch report as its `epoch` event (`bundle` only where the model trained in one)."""
    fields = dict(report.__dict__)
    if not report.bundle:
        del fields["bundle"]
    return fields


def epochs_text(count: int) -> str:
    return f"{count} epoch" if count == 1 else f"{count} epochs"


def planned_rate(report: EpochReport, group_size: int, cpu_node: bool) -> float:
    """The rate an epoch report gives the policies and the adapter: on a CPU node its steps'
    CPU-time rate (the rate with the cores to itself, as the profile and the calibrations
    measure it: the predictions share a node's cores out themselves, so a wall-clock rate would
    count the sharing twice), elsewhere, or where its CPU time was not measured, its samples/s."""
    step_cpu_s, _, samples = report.cpu
    if cpu_node and group_size >= 1 and step_cpu_s > 0 and samples > 0:
        return samples * group_size / step_cpu_s  # each trainer's steps: 1/size of the group's sum
    return report.samples_per_s


def stop_metric(spec, report: EpochReport) -> float | None:
    """The model's stop-rule metric after the epoch, lower is better (for the forecasts)."""
    loss = spec.model(report.model).train.stop.metric.value == "val_loss"
    value = report.val_loss if loss else -report.val_accuracy
    return value if math.isfinite(value) else None


class Coordinator:
    """See the module docstring. `run()` returns when every model has converged, or when the
    checkpoint signal's checkpoints are done."""

    def __init__(self, ctx: RunContext, policy: Policy, ledger: Ledger, records: dict[str, ModelRecord],
                 log: EventLog, console: Console, make_policy: Callable[[], Policy] | None = None,
                 reconsider: Callable[[str, ClusterView, Overheads, float | None], PolicySwitch | None] | None = None,
                 policy_named: Callable[[str], Policy] | None = None, early: EarlyStopping | None = None,
                 host_use: HostUse | None = None, ways: BundleWays | None = None):
        self.ctx, self.ledger, self.log, self.console = ctx, ledger, log, console
        self.host_use = host_use  # samples the ranks' CPU on a CPU job sharing one host
        self.started = time.monotonic()
        self.account = RunAccount(records)
        self.membership = Membership(ctx, ledger, self.account, self._send, log, console, ways)
        self.ways = self.membership.starter.ways  # how each bundle trains (runtime.fuse)
        tuner = RateTuner(ledger, policy, make_policy or (lambda: policy), self.account.measured_overheads,
                          AdaptLog(log, console))
        # policy auto, re-deciding on measured rates: the rule, and the policy of a name (given together)
        auto = PolicyReconsider(reconsider, policy_named, ledger.rates) if reconsider is not None else None
        self.adapter = Adapter(tuner, auto)
        self.rung_log = RungLog(ctx.run_dir, early) if early is not None else None
        self.driver = Driver(policy, ledger, self, self.adapter, early)
        self.last_keepalive = time.monotonic()
        self.checkpoint_signal = ctx.checkpoint_signal
        self.board: ScalarBoard | None = ScalarBoard(Path(ctx.run_dir) / "tensorboard")
        self.visits = VisitLog(Path(ctx.run_dir)) if ledger.partitions is not None else None
        if self.visits is not None:
            recover_visits(self.visits, ledger)
        self.epoch_metrics: dict[str, float | None] = {}  # a visit's epoch report waits for its hop
        self.search = RunSearch(ctx, self.account.records, log, console)

    # -- what results.json reports --------------------------------------------------------------

    @property
    def interrupted(self) -> bool:
        return self.driver.interrupted

    @property
    def planning_s(self) -> float:
        return self.driver.planning_s + self.adapter.seconds

    @property
    def switches(self) -> list[PolicySwitch]:
        return self.adapter.switches

    @property
    def records(self) -> dict[str, ModelRecord]:
        return self.account.records

    # -- the loop -------------------------------------------------------------------------------

    def run(self) -> None:
        """Until the run is over. Where it is not, yet nothing can move it on (no stream runs, no
        rank has a report to make), it fails at once with a `PolicyError` naming the policy, the
        models left and the driver's books, instead of after `runtime.timeout_s`."""
        cpu_started = time.thread_time()
        self.driver.start()
        while not self.driver.finished or self.membership.busy:
            if not self.membership.busy and not self.membership.local_reports:  # no rank has a report to make
                raise self.driver.stalled_error("no stream runs and no rank has a report to make")
            self._handle(self._next_report())
        if self.host_use is not None:
            self.host_use.sample()
        self._broadcast_command(Shutdown("checkpointed" if self.interrupted else "done"))
        self.account.costs.coordinator_cpu_s = time.thread_time() - cpu_started

    def _check_signal(self) -> None:
        """On the checkpoint signal: checkpoint every running model and start nothing new."""
        if self.interrupted or self.checkpoint_signal is None or not self.checkpoint_signal.is_set():
            return
        running = self.ledger.ids_in(ModelState.RUNNING)
        self.log.write("interrupted", at=self.now(), running=running)
        self.console.banner(f"checkpoint signal: checkpointing {len(running)} running model(s), then exiting")
        self.driver.interrupt()

    def _next_report(self) -> Any:
        deadline = time.monotonic() + self.ctx.timeout_s
        sleeps = IDLE.sleeps()
        while True:
            self._check_signal()  # before any report: a steady flow of them must not hold these back
            self.membership.send_checkpoints()  # what the last decisions asked of bundles
            self._keepalive()
            if self.host_use is not None:
                self.host_use.tick()
            if self.membership.local_reports:
                return self.membership.local_reports.popleft()
            message = self.ctx.ctrl.improbe(tag=Tag.REPORT)
            if message is not None:
                return message.recv()
            if time.monotonic() > deadline:
                running = self.ledger.ids_in(ModelState.RUNNING, ModelState.CHECKPOINTING)
                raise WaitTimeout(f"timed out after {self.ctx.timeout_s:g} s waiting for any report (running: "
                                  f"{running[:5]}; the books: {describe_books(self.ledger)})")
            time.sleep(next(sleeps))

    def _keepalive(self) -> None:
        if time.monotonic() - self.last_keepalive > self.ctx.timeout_s / 4:
            self.last_keepalive = time.monotonic()
            self._broadcast_command(KeepAlive())

    def _broadcast_command(self, command: Any) -> None:
        for placement in self.ctx.topology.placements:
            tag = Tag.PREPROCESSOR if placement.gpu is None else Tag.TRAINER
            self._send(command, placement.rank, tag)

    def _send(self, command: Any, rank: int, tag: int) -> None:
        send_object(self.ctx.ctrl, command, rank, tag, f"rank {rank} to take a command", self.ctx.timeout_s)

    # -- reports -> the driver's events ----------------------------------------------------------

    def _handle(self, report: Any) -> None:
        if isinstance(report, EpochReport):
            self._on_epoch(report)
        elif isinstance(report, MemberLeft):
            self._on_left(report)
        elif isinstance(report, VisitEnded):
            self._visit_ended(report)
        elif isinstance(report, Paused):
            self.membership.on_paused(report)
        elif isinstance(report, StreamDone):
            self.membership.on_stream_done(report)
        elif isinstance(report, EndNeeded):
            self.membership.on_end_needed(report)
        elif isinstance(report, EarlyStopped):
            self.driver.stopped(report.model, report.epochs, report.samples_per_s)
        elif isinstance(report, BundleDecided):  # planned at the kept way's measured rate from now on
            self.driver.rates_estimated(self.ways.decided(report, self.ledger.rates))
        elif not isinstance(report, Progress):  # a heartbeat: receiving it reset the deadline
            raise TypeError(f"coordinator got an unexpected report {report!r}")

    def _on_epoch(self, report: EpochReport) -> None:
        group_size = len(self.ledger.model(report.model).gpus)
        self.account.epoch(report, group_size)
        self.console.epoch(report.model, report.epoch, report.train_loss, report.val_accuracy,
                           report.samples_per_s, report.stream_samples_per_s)
        self.log.write("epoch", **epoch_fields(report))
        self._board_epoch(report)
        cpu_node = self.ctx.spec.cluster.device is Device.CPU
        rate = planned_rate(report, group_size, cpu_node) * self.ctx.epoch_scale(report.model)  # grouped: epoch-equivalent
        if not report.bundle:  # a bundle's rate is not its models' own
            self.driver.rate_measured(report.model, rate)
        if report.stop_reason is None and self.visits is not None:
            self.epoch_metrics[report.model] = stop_metric(self.ctx.spec, report)  # the epoch ends with the hop
            return
        if report.stop_reason is None:
            self.driver.epoch_completed(report.model, report.epoch, rate, stop_metric(self.ctx.spec, report))
            return
        self.membership.leave(self.ledger.model(report.model).stream, report.model)
        self.log.write("converged", model=report.model, epochs=report.epoch, reason=report.stop_reason)
        self.console.left(report.model, f"converged after {report.epoch} epochs ({report.stop_reason})")
        self.search.ended(report.model)
        self.driver.converged(report.model, report.epoch, rate)

    def _board_epoch(self, report: EpochReport) -> None:
        """The epoch's TensorBoard scalars; a disk that refuses them stops them, not the run."""
        if self.board is None:
            return
        try:
            self.board.epoch(report)
        except OSError as exc:
            self.board = None
            self.console.banner(f"tensorboard: cannot write under {Path(self.ctx.run_dir) / 'tensorboard'} ({exc}); "
                                "the run goes on without it")

    def _on_left(self, report: MemberLeft) -> None:
        self.account.costs.left(report, len(self.ledger.model(report.model).gpus))  # before the GPUs go
        self.membership.on_left(report)
        self.account.left(report)
        self.log.write("member_left", **report.__dict__)
        if self.visits is not None:  # sent after the save: the checkpoint that records its visit is committed
            self.visits.left(report.model, report.visited, self._visit_epoch(report), self.now())
        if report.converged:
            return
        self.account.count_checkpoint(report.checkpoint_s, len(self.ledger.model(report.model).gpus))
        self.log.write("checkpoint", model=report.model, epochs=report.epochs, epoch_samples=report.epoch_samples)
        where = f"epoch {report.epochs} + {report.epoch_samples} samples"
        self.console.left(report.model, f"checkpointed at {where}" if report.visited is None else
                          f"visited partition {report.visited} ({where}): hops")
        self.driver.checkpointed(report.model, report.epochs)

    def _visit_ended(self, report: VisitEnded) -> None:
        """A visit of partitioned data ended and the model hops (its checkpoint is being saved):
        to the driver, which counts it, and to the visit log, which logs it at the leave, once
        the checkpoint is committed (a model that converged on its visit only leaves)."""
        partition = self.visits.ended(report.model, self._visit_epoch(report), self.now())
        self.membership.leave(report.stream, report.model)  # its stream ends with its pass: out of it
        metric = self.epoch_metrics.pop(report.model, None)
        rate = self.ledger.rates.rate(report.model, max(1, len(self.ledger.model(report.model).gpus)))
        self.driver.visit_completed(report.model, partition, report.epochs, rate, metric)

    @staticmethod
    def _visit_epoch(report: MemberLeft | VisitEnded) -> int:
        """The epoch a visit belonged to (one that ended the epoch counted it already)."""
        return report.epochs if report.epoch_samples == 0 else report.epochs + 1

    # -- the World the driver calls ----------------------------------------------------------------

    def now(self) -> float:
        return time.monotonic() - self.started

    def round_ending(self, index: int) -> None:
        self.log.write("round_end", index=index, at=self.now())

    def checkpoint(self, model: str) -> None:
        self.membership.checkpoint(model)

    def record_rungs(self, decisions: Sequence[RungDecision]) -> None:
        """Each decision in rungs.jsonl (synced) and events.jsonl; a stopped model's end in
        its record (whether it was running, checkpointing or held at its rung)."""
        for record in self.rung_log.append(decisions, self.now()):
            self.log.write("rung", **record)
            rung = f"rung {record['index'] + 1} ({epochs_text(record['rung'])})"
            self.console.left(record["model"], f"{rung}: {record['verdict']}")
            if record["verdict"] == Verdict.STOPPED.value:
                self.account.records[record["model"]].stopped_early(record["index"])
                self.search.stopped(record["model"], record["rung"])
                self.log.write("converged", model=record["model"], epochs=record["rung"], reason=EARLY_STOP_REASON,
                               rung=record["index"])
                self.console.left(record["model"], f"stopped at {rung} (early stopping)")

    def stop(self, model: str) -> None:
        """Early stopping stopped `model` at the rung its master waits at: it ends there (its
        epoch's checkpoint is its last) and its GPUs are free once the driver hears so, next."""
        view = self.ledger.model(model)
        self.membership.verdict(model, RungVerdict(model, go_on=False))
        self.membership.leave(view.stream, model)
        rate = self.ledger.rates.rate(model, max(1, len(view.gpus)))
        self.membership.local_reports.append(EarlyStopped(model, view.epochs_done, rate))

    def rung_passed(self, model: str) -> None:
        self.membership.verdict(model, RungVerdict(model, go_on=True, next_stop=self.ledger.model(model).next_stop))

    def launch(self, launches: Sequence[Launch], new_round: bool, planning_s: float) -> None:
        if new_round:
            self.log.write("round_start", index=self.ledger.round, at=self.now())
            self.console.banner(f"round {self.ledger.round}")
            self.account.new_round(self.ledger.round)
        new_streams = sum(not launch.join for launch in launches)
        factors = self.search.launching([model for launch in launches for m in launch.members for model in m.ids])
        if factors:  # asked models: planned at their own architecture's rates from now on
            self.driver.rates_estimated(factors)
        for launch in launches:
            for member in launch.members if self.visits is not None else ():
                self.visits.started(member.model, launch.partition, list(member.gpus), self.now())
            if launch.join:
                self.membership.join(launch.stream, launch.members)
            else:
                self.membership.start_stream(launch.stream, launch.members, new_streams, launch.partition,
                                             launch.own_decoding)
