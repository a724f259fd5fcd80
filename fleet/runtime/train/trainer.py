"""Trainer ranks: wait for work, then train one model as one group of m trainers at a time.

Every step of a group is synchronous: a tiny control allreduce first (samples this trainer
has, whether it still has data this epoch, whether the master asks to stop), then the
gradient allreduce, each trainer's gradient weighted by its share of the step's samples,
so the group's step equals one process's step on the union of the shares. The epoch ends
when no trainer has data left in it; then BatchNorm statistics are averaged, the master
evaluates, checkpoints and reports, and the group goes on or leaves.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

import numpy as np

from fleet.engines.factory import create_engine
from fleet.engines.options import EngineOptions
from fleet.runtime.context import RunContext
from fleet.runtime.data.chunks import resumed_end_chunk
from fleet.runtime.data.preprocessor import OwnDecoder
from fleet.runtime.data.queues import Batch, Batcher, SampleQueue
from fleet.runtime.data.shares import MemberClock
from fleet.runtime.data.stream import MasterStream, StreamThread, WorkerShares, wait_thread
from fleet.runtime.launch.signals import EXIT_CHECKPOINTED
from fleet.runtime.protocol import (
    CheckpointModel,
    EndNeeded,
    EpochReport,
    KeepAlive,
    MemberLeft,
    Shutdown,
    StartBundle,
    StartMember,
    Tag,
    VisitEnded,
)
from fleet.runtime.train.best_predictions import BestPredictions
from fleet.runtime.train.bundle import BundleTraining
from fleet.runtime.train.collectives.factory import create_collective
from fleet.runtime.train.coordinator_link import CoordinatorLink
from fleet.runtime.train.member_checkpoints import MemberCheckpoints
from fleet.runtime.train.stint import EpochTotals, MemberCosts, next_batch, resumed_totals, set_apart, trainer_cpu_s
from fleet.runtime.train.stop import StopReason, StopTracker
from fleet.runtime.waiting import DATA_WAITS, IDLE, WaitTimeout, send_object


def create_group_comm(parent: Any, ranks: tuple[int, ...], uid: int) -> Any:
    group = parent.Get_group().Incl(list(ranks))
    try:
        return parent.Create_group(group, tag=60_000 + uid % 60_000)
    finally:
        group.Free()


def build_engine(ctx: RunContext, model: Any, group_size: int, epoch_limit: int | None = None):
    """This trainer's replica of `model` on its device (the emulated device: with the run's rates)."""
    device = ctx.device
    threads = ctx.spec.cluster.threads_per_trainer if device in ("cpu", "emulated") else None
    emulation = {}
    if device == "emulated":
        emulation = {"rates": ctx.rates, "group_size": group_size, "epochs_to_converge": epoch_limit}
    options = EngineOptions(model, ctx.input_shape, ctx.num_classes, device=device, threads=threads)
    return create_engine(options, **emulation)


def build_collective(ctx: RunContext, group_comm: Any):
    """The gradient collective of this trainer's group (`runtime.collective`)."""
    return create_collective(ctx.spec.runtime.collective, group_comm, ctx.device, ctx.timeout_s)


@dataclass
class Visit:
    """A member's visit of one partition of partitioned data: one pass over it, then a hop.

    Attributes:
        partition: the partition visited (its node's data).
        partitions: how many the model visits an epoch (all the data has; a model of a group:
            its group's).
        visited: partitions the model visited earlier in its epoch (from its checkpoint).
        ended: the pass is over (a visit cut short by the checkpoint signal never ends).
    """

    partition: int
    partitions: int
    visited: tuple[int, ...] = ()
    ended: bool = False

    def end(self) -> bool:
        """The pass is over; True when it ends the model's epoch (every partition visited)."""
        self.ended = True
        self.visited = (*self.visited, self.partition)
        if len(self.visited) < self.partitions:
            return False
        self.visited = ()
        return True

    @property
    def saves_at_leave(self) -> bool:
        """A leave keeps where the model stands, but a visit cut short is dropped (its last hop
        stays the model's state), and one that ended the epoch saved there already."""
        return self.ended and bool(self.visited)


def group_step(engine: Any, collective: Any, batch: Batch | None, count: int, total: float) -> float:
    """One step of a member of a group of 2 or more: its share (`count` of the step's `total`
    samples) of the gradients, summed over the group, then the update; returns its loss times
    `count`."""
    loss_sum = 0.0
    if count > 0:
        loss_sum = engine.compute_gradients(batch.x, batch.y) * count
        if count != total:
            engine.scale_gradients(count / total)
    else:
        engine.scale_gradients(0.0)
    collective.allreduce_gradients(engine)
    engine.apply_gradients()
    return loss_sum


class EpochEnd(IntEnum):
    """What a group does after an epoch (the master's decision, summed over the group)."""

    GO_ON = 0
    CONVERGED = 1  # its stop rule ended it, or early stopping stopped it at a rung
    LEAVE = 2  # asked to checkpoint while it waited at a rung (held there, or its round ended)


class GroupTraining:
    """One model trained by one group until it converges or is asked to leave; on partitioned
    data, for one visit (`Visit`): the member's stream thread, the steps, the epochs' ends
    (evaluation and the stop rule on the master) and the leave. Made by the `TrainerLoop` for
    each `StartMember`; it owns the model's engine, its collective, its `MemberCheckpoints`
    and, on the master, its `CoordinatorLink`."""

    def __init__(self, ctx: RunContext, start: StartMember, group_comm: Any):
        self.costs = MemberCosts()
        self.ctx, self.start, self.group_comm = ctx, start, group_comm
        if start.asked is not None:  # a search's model, asked after this rank read the spec
            ctx.spec = ctx.spec.with_models({start.model: start.asked})
        self.model = ctx.spec.model(start.model)
        self.is_master = group_comm.rank == 0
        self.size = group_comm.size
        self.checkpoints = MemberCheckpoints(ctx.run_dir, self.model, start, self.is_master, self.size, self.costs)
        self.engine = build_engine(ctx, self.model, self.size, start.epoch_limit)
        self.collective = build_collective(ctx, group_comm)
        self.tracker = StopTracker(self.model.train.stop, start.epoch_limit or self.model.train.max_epochs)
        partition = start.source.partition
        self.visit = None if partition is None else Visit(partition, len(ctx.partitions.parts_of(self.model.group)))
        self.tracker, epoch_samples = self.checkpoints.restore(self.engine, self.tracker, self.visit)
        self.collective.broadcast_engine(self.engine)
        self.totals = resumed_totals(epoch_samples, self.is_master, self.checkpoints.resumed_sums, self.size)
        self.stop_requested = False
        self.link = CoordinatorLink(ctx, self.model.id)
        self.best = BestPredictions(ctx, self.model, self.is_master)
        self.next_stop = start.next_stop  # early stopping: the epochs after which to wait for a verdict

    # -- the stint ------------------------------------------------------------------------

    def run(self) -> MemberLeft:
        began = time.monotonic()
        qt = SampleQueue(self.ctx.spec.runtime.qt_samples, f"Qt of {self.model.id}")
        share_comm = self.group_comm.Dup()
        if self.is_master:  # a visit passes once over its partition, from its start
            clock = MemberClock(len(self.ctx.train_idx_of(self.start.source.group)),
                                0 if self.visit else self.totals.samples)
            stream: StreamThread = MasterStream(self.ctx, self.start, share_comm, qt, clock)
        else:
            stream = WorkerShares(self.ctx, self.start, share_comm, qt)
        stream.start()
        if self.is_master:
            self._claim_stream_end()
        rt = self.ctx.spec.runtime
        batcher = Batcher(qt, self.model.train.batch_size, rt.qd_batches, self.ctx.timeout_s, self.model.id)
        try:
            converged = self._train(batcher, stream)
        finally:
            stream.request_leave()
            batcher.stop()
        self.checkpoints.gpu_seconds += (time.monotonic() - began) * self.size
        return self._leave(converged, stream)

    def _leave(self, converged: bool, stream: StreamThread) -> MemberLeft:
        """After the last step: a hop's news first, then the save that keeps the model's place
        (not for a model that converged, nor a visit cut short); the stream thread drains on."""
        self._tell_hop(converged)
        cpu, waits, compute_rate = (0.0, 0.0, 0), (0.0, 0.0), 0.0
        if not converged and (self.visit is None or self.visit.saves_at_leave):
            loss_sum, compute_s, cpu, waits = self._group_epoch_sums()
            self.checkpoints.epoch_sums = (loss_sum, compute_s)
            compute_rate = self.totals.samples / compute_s if compute_s > 0 else 0.0
            self._save_checkpoint()
        self.ctx.draining.append(stream)
        return MemberLeft(
            self.model.id, self.start.layout.stream, self.start.group_uid, converged, self.tracker.epochs,
            self.totals.samples, self.checkpoints.gpu_seconds, self.costs.take_checkpoint_s(),
            self.engine.num_parameters, self.ctx.take_val_decoded(), self.costs.take_start_s(),
            self.visit.partition if self.visit and self.visit.ended else None, cpu, compute_rate, waits,
        )

    def _tell_hop(self, converged: bool) -> None:
        """A group whose visit ended hops: its master tells the coordinator before the hop's
        checkpoint is saved (the driver sees the model checkpointing on its GPUs meanwhile)."""
        visit = self.visit
        if converged or visit is None or not visit.ended or not self.is_master:
            return
        hop = VisitEnded(self.model.id, self.start.layout.stream, self.tracker.epochs, self.totals.samples)
        self.link.report(hop, "a visit's end")

    def _claim_stream_end(self) -> None:
        """Ask for the stream past its end when this member needs it: the coordinator computed
        the end from the newest checkpoint, and loading fell back to an older one."""
        end = self.start.layout.end
        if end is None or self.visit is not None:  # a visit's end is one pass, whatever it resumed from
            return
        need = resumed_end_chunk(self.start.first_chunk, self.tracker.max_epochs, self.tracker.epochs,
                                 self.totals.samples, len(self.ctx.train_idx_of(self.start.source.group)),
                                 self.start.source.chunk_samples)
        if need > end:
            self.link.report(EndNeeded(self.model.id, self.start.layout.stream, need), "a stream-end claim")

    # -- the loop -------------------------------------------------------------------------

    def _train(self, batcher: Batcher, stream: StreamThread) -> bool:
        """Steps until the model converges (True) or the master asks to leave (False)."""
        done_this_epoch = False
        while True:
            if self.is_master and self.link.poll_commands():
                self.stop_requested = True
            batch = self._next_batch(batcher, stream) if not done_this_epoch else None
            count = batch.count if batch is not None else 0
            has_more = batch is not None and not batch.epoch_end and not batch.leave
            # a leave always follows the coordinator's checkpoint command, which this thread
            # may not have polled yet (it waited for the batch): a leave never closes an epoch
            leaving = batch is not None and batch.leave
            control = np.array([count, float(has_more), float(self.is_master and (self.stop_requested or leaving))])
            if self.size > 1:
                self.collective.allreduce_sum(control)
            total, more, stop = control
            if stop > 0:
                return False
            if total > 0:
                self._step(batch, count, total)
            done_this_epoch = done_this_epoch or not has_more
            if more == 0 and self.visit is not None:  # the model leaves (hops) unless it converged
                return bool(self.visit.end() and self._end_epoch() is EpochEnd.CONVERGED)
            if more == 0:
                end = self._end_epoch()
                if end is not EpochEnd.GO_ON:
                    return end is EpochEnd.CONVERGED
                done_this_epoch = False
            elif self.is_master:
                self.link.maybe_progress(self.tracker.epochs, self.totals.samples, self.totals.started)

    def _next_batch(self, batcher: Batcher, stream: StreamThread) -> Batch:
        batch = next_batch(self.ctx, batcher, stream)
        if not batch.leave:
            self.costs.first_batch_came()
        return batch

    def _step(self, batch: Batch | None, count: int, total: float) -> None:
        started, cpu_started = time.monotonic(), time.thread_time()
        if self.size == 1:  # nothing to reduce: the engine's train_step (one compiled call for Keras)
            self.totals.loss_sum += self.engine.train_step(batch.x, batch.y) * count
        else:
            self.totals.loss_sum += group_step(self.engine, self.collective, batch, count, total)
        self.totals.samples += int(total)
        self.totals.compute_s += time.monotonic() - started
        self.totals.step_cpu_s += time.thread_time() - cpu_started

    # -- epochs ---------------------------------------------------------------------------

    def _end_epoch(self) -> EpochEnd:
        """Close the epoch on every trainer of the group: the model goes on, converged (its stop
        rule, or early stopping at a rung), or leaves (held at its rung: checkpointed)."""
        loss_sum, compute_s, cpu, waits = self._group_epoch_sums()
        if self.size > 1:
            self._average_buffers()
        samples = max(1, self.totals.samples)
        train_loss = loss_sum / samples
        compute_rate = samples / max(1e-9, compute_s)
        epoch_s = time.monotonic() - self.totals.started
        consumed = self.totals.consumed_per_s(epoch_s)
        lr = self.engine.lr
        decision = np.zeros(1)
        if self.is_master:
            reason = self._evaluate_and_report(train_loss, (compute_rate, consumed), samples, epoch_s, lr, cpu, waits)
            decision[0] = float(EpochEnd.CONVERGED if reason is not None else self._at_rung())
        else:
            self.engine.end_epoch()
        if self.size > 1:
            self.collective.allreduce_sum(decision)
        self.totals = EpochTotals()
        return EpochEnd(int(decision[0]))

    def _at_rung(self) -> EpochEnd:
        """Early stopping: at its next rung the master waits for the coordinator's verdict
        (not on a visit of partitioned data: the model hops there anyway, and the verdict
        takes effect at its checkpoint)."""
        if self.next_stop is None or self.visit is not None or self.tracker.epochs < self.next_stop:
            return EpochEnd.GO_ON
        verdict = self.link.await_verdict(self.tracker.epochs)
        if verdict is None:
            return EpochEnd.LEAVE
        self.next_stop = verdict.next_stop
        return EpochEnd.GO_ON if verdict.go_on else EpochEnd.CONVERGED

    def _group_epoch_sums(self) -> tuple[float, float, tuple[float, float, int], tuple[float, float]]:
        """The group's loss sum and mean compute seconds of the epoch so far, its CPU seconds in
        steps and in all with the samples they trained, and its stream threads' waits for data
        (seconds, CPU seconds) (this stint's part of the epoch; every member calls it)."""
        totals = self.totals
        waits = DATA_WAITS.since(totals.waits_started)
        sums = np.array([totals.loss_sum, totals.compute_s, totals.step_cpu_s, trainer_cpu_s() - totals.cpu_started,
                         *waits])
        if self.size > 1:
            self.collective.allreduce_sum(sums)
        return (float(sums[0]), float(sums[1] / self.size), (float(sums[2]), float(sums[3]), totals.samples - totals.resumed),
                (float(sums[4]), float(sums[5])))

    def _average_buffers(self) -> None:
        buffers = self.engine.flat_buffers()
        if buffers.size:
            buffers = buffers.astype(np.float64)
            self.collective.allreduce_sum(buffers)
            self.engine.load_flat_buffers((buffers / self.size).astype(np.float32))

    def _evaluate_and_report(self, train_loss, rates, samples, epoch_s, lr, cpu, waits) -> StopReason | None:
        compute_rate, consumed = rates  # samples/s computed, and taken from the stream
        ending, ending_cpu = time.monotonic(), trainer_cpu_s()
        val_x, val_y = self.ctx.validation_of(self.model.group)
        metrics, probabilities = self.engine.evaluate_with_probabilities(val_x, val_y)
        self.engine.end_epoch()
        reason = self.tracker.update(
            {"train_loss": train_loss, "val_loss": metrics["loss"], "val_accuracy": metrics["accuracy"]}
        )
        record = {
            "epoch": self.tracker.epochs, "train_loss": train_loss, "val_loss": metrics["loss"],
            "val_accuracy": metrics["accuracy"], "samples_per_s": compute_rate, "lr": lr, "epoch_s": epoch_s,
            "samples": samples, "val_samples": len(val_y),
        }
        self.checkpoints.history.append(record)
        self.totals = EpochTotals()
        self._save_checkpoint()
        self.best.epoch_ended(self.engine, self.checkpoints.history, probabilities,
                              self.checkpoints.store.last_save.get(self.model.id))
        report = EpochReport(
            self.model.id, self.start.layout.stream, self.tracker.epochs, train_loss, metrics["loss"],
            metrics["accuracy"], compute_rate, consumed, lr, epoch_s, self.costs.take_checkpoint_s(),
            reason.value if reason else None, samples, self.costs.take_start_s(), cpu, len(val_y),
            end_s=time.monotonic() - ending, end_cpu_s=trainer_cpu_s() - ending_cpu, waits=waits,
        )
        self.link.report(report, "an epoch report")
        return reason

    def _save_checkpoint(self) -> None:
        """The master saves the model where it stands (the other members return at once)."""
        self.checkpoints.save(self.engine, self.tracker, self.totals.samples, self.visit)


class TrainerLoop:
    """The main loop of a trainer rank: idle until a `StartMember` (or a `StartBundle`), train,
    report, repeat; where the run's policy has its members decode their own streams, with an
    `OwnDecoder`."""

    def __init__(self, ctx: RunContext):
        self.ctx = ctx

    def run(self) -> None:
        decoder = OwnDecoder(self.ctx) if self.ctx.own_decoding else None
        if decoder is not None:
            decoder.start()
            set_apart(decoder)  # its decoding is booked as a preprocessor's
        while True:
            command = self._next_command()
            if isinstance(command, Shutdown):
                self._finish_draining()
                if decoder is not None:
                    decoder.stop()
                if command.reason == "checkpointed":
                    self.ctx.exit_code = EXIT_CHECKPOINTED
                return
            if isinstance(command, StartMember):
                self._run_member(command)
            elif isinstance(command, StartBundle):
                self._run_bundle(command)

    def _next_command(self):
        pending = self.ctx.pending
        if pending:
            return pending.pop(0)
        deadline = time.monotonic() + self.ctx.timeout_s
        sleeps = IDLE.sleeps()
        while True:
            message = self.ctx.ctrl.improbe(source=0, tag=Tag.TRAINER)
            if message is not None:
                command = message.recv()
                if isinstance(command, (KeepAlive, CheckpointModel)):
                    deadline = time.monotonic() + self.ctx.timeout_s
                    continue
                return command
            self._reap_draining()
            if time.monotonic() > deadline:
                raise WaitTimeout(f"timed out after {self.ctx.timeout_s:g} s waiting for a command from the coordinator")
            time.sleep(next(sleeps))

    def _run_member(self, start: StartMember) -> None:
        self.ctx.who.role = f"trainer of {start.model}"
        group_comm = create_group_comm(self.ctx.group_parent, start.ranks, start.group_uid)
        try:
            training = GroupTraining(self.ctx, start, group_comm)
            left = training.run()
            if start.ranks[0] == self.ctx.rank:
                # the checkpoint is saved: the next round may be planned and its data decoded
                # while the group closes its collective (a gloo group's close is two barriers)
                send_object(self.ctx.ctrl, left, 0, Tag.REPORT, "the coordinator to take a leave report",
                            self.ctx.timeout_s)
            training.collective.close()
        finally:
            group_comm.Free()
        self.ctx.who.role = "trainer"

    def _run_bundle(self, start: StartBundle) -> None:
        """Train a bundle on this trainer; the last model's leave report releases the slot."""
        self.ctx.who.role = f"trainer of bundle {', '.join(start.models)}"
        group_comm = create_group_comm(self.ctx.group_parent, start.ranks, start.group_uid)
        try:
            left = BundleTraining(self.ctx, start, group_comm).run()
            send_object(self.ctx.ctrl, left, 0, Tag.REPORT, "the coordinator to take a leave report",
                        self.ctx.timeout_s)
        finally:
            group_comm.Free()
        self.ctx.who.role = "trainer"

    def _reap_draining(self) -> None:
        draining = self.ctx.draining
        for thread in [t for t in draining if not t.is_alive()]:
            draining.remove(thread)
            if thread.error is not None:
                raise thread.error

    def _finish_draining(self) -> None:
        for thread in self.ctx.draining:
            wait_thread(thread, f"stream thread {thread.name} to finish", self.ctx.timeout_s)
        self._reap_draining()
