"""A bundle trained on one trainer (issue 49): several models of one architecture as one fused
model, or one by one (`fleet.engines.bundle`), over the batches of the stream they share.

The bundle is one master of its stream (one stream thread, one batcher at the models' common
batch size); a step is one step of the bundle's engine (`BundleSteps`: fused or one by one, as
the command says; or, under `runtime.fuse: auto`, timed both ways in its first steps, the
faster kept and the decision told to the coordinator: `BundleDecided`). Per model it keeps what
a model alone keeps (`GroupTraining`): its checkpoints (the files a model alone writes), stop rule,
early-stopping rungs, best predictions and reports. The models start at one position in their
epochs, so their epochs end together: one validation pass, then each model's stop rule,
checkpoint and `EpochReport` (its rates the bundle's, `EpochReport.bundle`); all the reports go
out before any model waits at a rung for its verdict. A model that converges, is stopped at a
rung, is held there or is asked to checkpoint leaves the bundle (its `MemberLeft` goes at
once); the others train on. The last one's `MemberLeft` releases the trainer slot.
"""

from __future__ import annotations

import time
from typing import Any

from fleet.engines.options import EngineOptions
from fleet.runtime.context import RunContext
from fleet.runtime.data.chunks import resumed_end_chunk
from fleet.runtime.data.queues import Batch, Batcher, SampleQueue
from fleet.runtime.data.shares import MemberClock
from fleet.runtime.data.stream import MasterStream, StreamThread
from fleet.runtime.protocol import BundleDecided, EndNeeded, EpochReport, MemberLeft, StartBundle, StartMember
from fleet.runtime.train.best_predictions import BestPredictions
from fleet.runtime.train.bundle_steps import BundleSteps
from fleet.runtime.train.coordinator_link import CoordinatorLink
from fleet.runtime.train.member_checkpoints import MemberCheckpoints
from fleet.runtime.train.stint import EpochTotals, MemberCosts, next_batch, resumed_totals, trainer_cpu_s
from fleet.runtime.train.stop import StopReason, StopTracker


class StateSink:
    """What a member's `MemberCheckpoints.restore` loads its checkpoint into before the bundle
    is built: the engine bytes, kept."""

    def __init__(self):
        self.data: bytes | None = None

    def load_state_bytes(self, data: bytes) -> None:
        self.data = data


class MemberEngine:
    """One model of a bundle as an engine to its `MemberCheckpoints` and `BestPredictions`: its
    state (the bytes its own engine would write) and its predictions, from the bundle's engine
    of the moment (`steps.engine`: a change of way replaces it)."""

    def __init__(self, steps: BundleSteps, model_id: str):
        self.steps, self.model_id = steps, model_id

    def state_bytes(self) -> bytes:
        return self.steps.engine.member_state_bytes(self.model_id)

    def predict(self, x: Any, batch_size: int = 256) -> Any:
        return self.steps.engine.predict(x, batch_size)[self.model_id]


class BundleMember:
    """What one model of a bundle keeps while it trains there (as a model's `GroupTraining`
    keeps it on its master): its command, checkpoints, stop tracker, best predictions, costs,
    next rung and the epoch's loss sum.

    Args:
        ctx: the rank's context.
        start: the model's part of the bundle's command (`StartBundle.member`).
    """

    def __init__(self, ctx: RunContext, start: StartMember):
        self.start = start
        self.model = ctx.spec.model(start.model)
        self.costs = MemberCosts()
        self.checkpoints = MemberCheckpoints(ctx.run_dir, self.model, start, True, 1, self.costs)
        self.tracker = StopTracker(self.model.train.stop, start.epoch_limit or self.model.train.max_epochs)
        self.best = BestPredictions(ctx, self.model, True)
        self.next_stop = start.next_stop
        self.loss_sum = 0.0
        self.engine: MemberEngine | None = None

    def restore(self) -> tuple[bytes | None, int]:
        """The model's newest checkpoint where its command resumes it: its engine bytes (None:
        none) and its position in its epoch; its tracker and history come back here."""
        sink = StateSink()
        self.tracker, position = self.checkpoints.restore(sink, self.tracker, None)
        self.loss_sum = self.checkpoints.resumed_sums[0] if position else 0.0
        return sink.data, position

    def save(self, epoch_samples: int) -> None:
        self.checkpoints.save(self.engine, self.tracker, epoch_samples, None)


def build_bundle(ctx: RunContext, members: list[BundleMember], states: dict[str, bytes],
                 way: str | None) -> BundleSteps:
    """The bundle's steps on this trainer's device (the emulated device: with the run's rates)."""
    device = ctx.device
    threads = ctx.spec.cluster.threads_per_trainer if device in ("cpu", "emulated") else None
    options = [EngineOptions(m.model, ctx.input_shape, ctx.num_classes, device=device, threads=threads)
               for m in members]
    limits = {m.model.id: m.start.epoch_limit for m in members}
    return BundleSteps(options, states, way, ctx.spec.runtime.fuse_min_speedup,
                       rates=ctx.rates if device == "emulated" else None, epoch_limits=limits)


class BundleTraining:
    """One bundle trained until its last model leaves (see the module docstring). Made by the
    `TrainerLoop` for each `StartBundle`; it owns the bundle's engine, its models'
    `BundleMember`s and its `CoordinatorLink`.

    Args:
        ctx: the rank's context.
        start: the command.
        group_comm: the communicator of the bundle's one rank (its stream's shares go through it).
    """

    def __init__(self, ctx: RunContext, start: StartBundle, group_comm: Any):
        self.ctx, self.start, self.group_comm = ctx, start, group_comm
        self.members = {m: BundleMember(ctx, start.member(m)) for m in start.models}
        restored = {m: member.restore() for m, member in self.members.items()}
        positions = [position for _, position in restored.values()]
        self.position = max(set(positions), key=positions.count)
        # a model that fell back to an older checkpoint at another position leaves at once
        self.apart = {m: (self.members.pop(m), position) for m, (_, position) in restored.items()
                      if position != self.position}
        states = {m: data for m, (data, _) in restored.items() if data is not None and m in self.members}
        self.steps = build_bundle(ctx, list(self.members.values()), states, start.way)
        for model_id, member in self.members.items():
            member.engine = MemberEngine(self.steps, model_id)
        self.lead = self.members[next(iter(self.members))]
        self.totals = resumed_totals(self.position, True, self.lead.checkpoints.resumed_sums, 1)
        self.link = CoordinatorLink(ctx, start.models[0], start.models)
        self.shared_since = time.monotonic()  # the trainer's time is shared among the models in it
        self.last: MemberLeft | None = None

    @property
    def engine(self) -> Any:
        """The bundle's engine (fused, or its models one by one)."""
        return self.steps.engine

    # -- the stint ------------------------------------------------------------------------

    def run(self) -> MemberLeft:
        """Train until every model left; returns the last one's `MemberLeft` (the others went)."""
        for model, (member, position) in self.apart.items():
            self.link.report(self._left(model, member, False, position), "a leave report")
        lead = self.lead.start
        qt = SampleQueue(self.ctx.spec.runtime.qt_samples, f"Qt of bundle {lead.model}")
        clock = MemberClock(len(self.ctx.train_idx_of(lead.source.group)), self.totals.samples)
        stream = MasterStream(self.ctx, lead, self.group_comm.Dup(), qt, clock)
        stream.start()
        self._claim_stream_end()
        batcher = Batcher(qt, self.lead.model.train.batch_size, self.ctx.spec.runtime.qd_batches, self.ctx.timeout_s,
                          f"bundle-{lead.model}")
        try:
            self._train(batcher, stream)
        finally:
            stream.request_leave()
            batcher.stop()
        self.ctx.draining.append(stream)
        return self.last

    def _claim_stream_end(self) -> None:
        """Ask for the stream past its end where a model resumed from an older checkpoint than
        the coordinator counted on (as `GroupTraining` does for a model alone)."""
        end, lead = self.start.layout.end, self.lead.start
        if end is None:
            return
        n = len(self.ctx.train_idx_of(lead.source.group))
        need = max(resumed_end_chunk(lead.first_chunk, m.tracker.max_epochs, m.tracker.epochs, self.totals.samples,
                                     n, lead.source.chunk_samples) for m in self.members.values())
        if need > end:
            self.link.report(EndNeeded(lead.model, self.start.layout.stream, need), "a stream-end claim")

    def _train(self, batcher: Batcher, stream: StreamThread) -> None:
        """Steps until every model left: converged, stopped, held, or asked to checkpoint (a
        leave of the stream, the stream's end or a regroup without this master, takes them all)."""
        while self.members:
            self.link.poll_commands()
            asked = self.link.take_asked()
            for model in [m for m in self.members if m in asked]:
                self._leave(model, converged=False)
            if not self.members:
                return
            batch = next_batch(self.ctx, batcher, stream)
            if batch.leave:
                for model in list(self.members):
                    self._leave(model, converged=False)
                return
            for member in self.members.values():
                member.costs.first_batch_came()
            if batch.count > 0:
                self._step(batch)
            if batch.epoch_end:
                self._end_epoch()
            else:
                self.link.maybe_progress(self.lead.tracker.epochs, self.totals.samples, self.totals.started)

    def _step(self, batch: Batch) -> None:
        started, cpu_started = time.monotonic(), time.thread_time()
        losses, decision = self.steps.step(batch.x, batch.y, batch.count == self.lead.model.train.batch_size)
        for model, loss in losses.items():
            self.members[model].loss_sum += loss * batch.count
        self.totals.samples += batch.count
        self.totals.compute_s += time.monotonic() - started
        self.totals.step_cpu_s += time.thread_time() - cpu_started
        if decision is not None:
            self.link.report(BundleDecided(decision.models, self.start.layout.stream, decision.fused_step_s,
                                           decision.one_by_one_step_s, decision.kept.value), "a bundle's decision")

    # -- epochs ---------------------------------------------------------------------------

    def _end_epoch(self) -> None:
        """Close every model's epoch (see the module docstring): reports first, then the leaves
        of the models that converged, then the verdicts of those at a rung."""
        totals, samples = self.totals, max(1, self.totals.samples)
        epoch_s = time.monotonic() - totals.started
        rates = (samples / max(1e-9, totals.compute_s), totals.consumed_per_s(epoch_s))
        cpu = (totals.step_cpu_s, trainer_cpu_s() - totals.cpu_started, totals.samples - totals.resumed)
        group = self.lead.model.group
        evaluated = self.engine.evaluate_with_probabilities(*self.ctx.validation_of(group))
        self._share_time()
        self.totals = EpochTotals()
        bundle = tuple(self.members)
        reasons = {m: self._epoch_ended(m, evaluated[m], samples, epoch_s, rates, cpu, bundle) for m in bundle}
        for model, reason in reasons.items():
            if reason is not None:
                self._leave(model, converged=True)
        for model in [m for m in bundle if reasons[m] is None]:
            self._at_rung(model)

    def _epoch_ended(self, model: str, evaluated: tuple, samples: int, epoch_s: float, rates: tuple[float, float],
                     cpu: tuple, bundle: tuple[str, ...]) -> StopReason | None:
        """One model's end of epoch: its stop rule, checkpoint, best predictions and report."""
        member = self.members[model]
        metrics, probabilities = evaluated
        lr = self.engine.lr(model)
        self.engine.end_epoch(model)
        train_loss = member.loss_sum / samples
        member.loss_sum = 0.0
        reason = member.tracker.update({"train_loss": train_loss, "val_loss": metrics["loss"],
                                        "val_accuracy": metrics["accuracy"]})
        val_samples = len(self.ctx.validation_of(member.model.group)[1])
        member.checkpoints.history.append({
            "epoch": member.tracker.epochs, "train_loss": train_loss, "val_loss": metrics["loss"],
            "val_accuracy": metrics["accuracy"], "samples_per_s": rates[0], "lr": lr, "epoch_s": epoch_s,
            "samples": samples, "val_samples": val_samples})
        member.save(0)
        member.best.epoch_ended(member.engine, member.checkpoints.history, probabilities,
                                member.checkpoints.store.last_save.get(model))
        report = EpochReport(model, self.start.layout.stream, member.tracker.epochs, train_loss, metrics["loss"],
                             metrics["accuracy"], rates[0], rates[1], lr, epoch_s, member.costs.take_checkpoint_s(),
                             reason.value if reason else None, samples, member.costs.take_start_s(), cpu,
                             val_samples, bundle)
        self.link.report(report, "an epoch report")
        return reason

    def _at_rung(self, model: str) -> None:
        """Early stopping: a model at its next rung waits for its verdict; stopped, it leaves
        there (converged); held (a checkpoint command instead), it leaves with its checkpoint."""
        member = self.members[model]
        if member.next_stop is None or member.tracker.epochs < member.next_stop:
            return
        verdict = self.link.await_verdict(member.tracker.epochs, model)
        if verdict is not None and verdict.go_on:
            member.next_stop = verdict.next_stop
        else:
            self._leave(model, converged=verdict is not None)

    # -- leaves ---------------------------------------------------------------------------

    def _leave(self, model: str, converged: bool) -> None:
        """`model` leaves the bundle: saved where it stands unless it converged; its
        `MemberLeft` goes at once, but the last one's, which `run` returns."""
        self._share_time()
        member = self.members.pop(model)
        compute_s = self.totals.compute_s
        if not converged:
            member.checkpoints.epoch_sums = (member.loss_sum, compute_s)
            member.save(self.totals.samples)
        left = self._left(model, member, converged, self.totals.samples, self.engine.parameter_count(model))
        if self.members:
            self.steps.leave(model)
            self.link.report(left, "a leave report")
        else:
            self.last = left

    def _left(self, model: str, member: BundleMember, converged: bool, epoch_samples: int,
              parameters: int = 0) -> MemberLeft:
        """A model's leave report, `epoch_samples` into its epoch (no CPU figures: the bundle's
        are not the model's)."""
        return MemberLeft(model, self.start.layout.stream, self.start.group_uid, converged, member.tracker.epochs,
                          epoch_samples, member.checkpoints.gpu_seconds, member.costs.take_checkpoint_s(), parameters,
                          self.ctx.take_val_decoded(), member.costs.take_start_s())

    def _share_time(self) -> None:
        """The trainer's seconds since the last share, split evenly among the models in it."""
        now = time.monotonic()
        share = (now - self.shared_since) / max(1, len(self.members))
        for member in self.members.values():
            member.checkpoints.gpu_seconds += share
        self.shared_since = now
