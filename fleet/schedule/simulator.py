"""Discrete-event simulator: drives any :class:`~fleet.schedule._base.Policy` on a model.

The simulator is the first of two worlds of the policy `Driver` (the MPI coordinator is
the second). It knows what policies must not: each model's true epochs to converge. It
turns them into the events the runtime would observe and applies each decision at once.
The driver's `Ledger` keeps every model's state, epochs and visits; this module runs the
event loop and carries decisions out; `fleet.schedule.scenario` says what a run is about,
`fleet.schedule.stream_physics` how streams move, and `fleet.schedule.sim_records` what a run
leaves.

Model of a run
    * A stream moves at the pace of its slowest running member, ``min_i r_i(m_i)``; every
      member advances by the same number of samples. A member converges at the end of its
      ``E_i``-th epoch (``E_i * n`` samples, a partial epoch carries over a checkpoint) and
      frees its GPUs at once; the stream speeds up if it was the slowest.
    * A stream decodes each sample once for all its members: its decoded samples are the
      samples it moved while at least one member was training.
    * With a `Scenario.decode_rate` (what the run's preprocessors decode together), no stream
      moves faster than decoding: the running streams share it max-min fairly (a stream
      whose members need less than an equal share leaves the rest to the others). Without
      one, decoding keeps up, the paper's assumption.
    * A stream that decodes in its member's own trainer process (`Launch.own_decoding`,
      Baseline's) takes no share of the preprocessors: its member decodes each sample
      between its steps, at `Scenario.own_decode_rate`, so it moves at
      ``1 / (1 / r + 1 / own_decode_rate)``. Without one, its decoding is free.
    * A bundle (`Member.models`: models of one architecture on one trainer, `fleet.schedule.bundling`)
      moves its models together at the bundle's rate, ``1 / sum_i 1/r_i(1)`` (a step of each in
      turn; a bundle planned at a measured rate has its models' rates scaled to it); on shared
      cores its models count as one trainer.
    * Launching costs ``planning_s`` (fixed, or measured around the policy call); a member
      resumed from a checkpoint also waits ``restore_s``. A new stream starts when all its
      members are ready; a member joining a running stream starts when it is ready.
      Checkpointing costs ``checkpoint_s`` per model, all in parallel. GPUs are held during
      these overheads. Costs common to every policy (first model build, data loading) are
      left out.

Partitioned data (model hopping)
    With `Scenario.partition_sizes` (or a hopping policy on whole data: one partition), a
    stream trains each member for one visit of the partition its GPUs are on: its members all
    start together and leave when the stream has moved that partition's samples. Each then
    hops: a checkpoint (``checkpoint_s``, GPUs held), and a restore where it lands next
    (``restore_s``), unless that visit ended its last epoch. With a `decode_rate`, each
    partition's nodes decode their own partition at ``decode_rate / p``. The checkpoint signal
    drops the visits in flight: the models go back to their last hop.

Interrupts and resumes
    ``simulate(..., interrupt_at=t)`` does what the runtime does on the checkpoint signal:
    at ``t`` every running model is checkpointed, nothing new starts, and the run ends when
    the last checkpoint is done (``SimResult.interrupted``). :func:`resumed_scenario` then
    gives the scenario of the run started again from those checkpoints: the models not yet
    converged, each ``PAUSED`` at the (fractional) epochs it had trained, or ``PENDING``
    when it never started (``Scenario.resumed``).

Results: makespan, rounds, samples decoded, a GPU-time breakdown (useful training, pacing
slack, overheads, idle), each GPU's idle time, the planning time of every planning call,
and the full timeline of rounds, streams and members.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from fleet.schedule._base import ModelState, Policy, PolicyError
from fleet.schedule.bundling import bundle_rate
from fleet.schedule.costs import Overheads
from fleet.schedule.driver import Driver, Launch
from fleet.schedule.early_stop import EarlyStopSettings, RungDecision, create_early_stopping
from fleet.schedule.grouping import group_of
from fleet.schedule.ledger import Ledger
from fleet.schedule.partitions import Partitions
from fleet.schedule.rates import RateTable
from fleet.schedule.scenario import Cluster, Scenario, whole_epochs

if TYPE_CHECKING:  # annotations only: the adapter's own simulations import this module
    from fleet.schedule.adapting import Adapter, AdaptNotes
    from fleet.schedule.choice import PolicySwitch
    from fleet.schedule.refine import RateChange, Refinement
from fleet.schedule.sim_records import (
    GpuTime,
    MemberRecord,
    Outcome,
    RoundRecord,
    SimResult,
    StreamRecord,
    SwitchRecord,
    Timeline,
    gpu_time,
)
from fleet.schedule.stream_physics import (
    BOUNDARY,
    CHECKPOINT_DONE,
    EPS,
    INTERRUPT,
    START,
    EventQueue,
    ModelMotion,
    StreamMotion,
    StreamPhysics,
    decode_shares,
)

__all__ = [
    "Cluster", "GpuTime", "MemberRecord", "Outcome", "RoundRecord", "Scenario", "SimResult", "StreamRecord",
    "Timeline", "decode_shares", "resumed_scenario", "simulate", "whole_epochs",
]


AdapterFactory = Callable[[Ledger, Policy, "AdaptNotes", Overheads], "Adapter"]
"""``(ledger, policy, notes, overheads) -> Adapter`` for a simulated run that adapts as the
runtime does (`fleet.schedule.adapting.simulation_adapter` makes one)."""


def simulate(
    policy: Policy, scenario: Scenario, overheads: Overheads = Overheads(), interrupt_at: float | None = None,
    adapt: AdapterFactory | None = None, early_stop: EarlyStopSettings | None = None,
) -> SimResult:
    """Run ``policy`` on ``scenario`` until every model converged, or until the run stopped
    by the checkpoint signal at ``interrupt_at`` has checkpointed its running models.

    With ``adapt``, the run weighs the rates it measures (the scenario's true ``rates``, where
    the policy plans with ``planning_rates``) and, under ``policy: auto``, reconsiders the
    policy, as the runtime does (`fleet.schedule.adapting`). With ``early_stop``, models are
    stopped or held at rungs on the metrics of the scenario's ``curves`` (no curves: a fixed
    draw per model, which predicts how many survive each rung, not which; `_metric`), through
    the same driver code as a run.

    Raises:
        PolicyError: when the policy breaks the protocol or stalls.
    """
    return _Run(policy, scenario, overheads, interrupt_at, adapt, early_stop).run()


def resumed_scenario(scenario: Scenario, result: SimResult) -> Scenario | None:
    """The scenario of a run started again from the checkpoints an interrupted run left:
    its models not yet converged, with the epochs they trained. None when all converged."""
    keep = [i for i, done in enumerate(result.epochs_trained) if done < scenario.true_epochs[i] - EPS]
    if not keep:
        return None

    def subset(table: RateTable | None) -> RateTable | None:
        if table is None:
            return None
        return table.subset([table.models[i].id for i in keep])

    before = scenario.resumed or (None,) * len(scenario.true_epochs)
    launched = {r.model for r in result.timeline.members}
    ids = scenario.rates.ids
    resumed = tuple(result.epochs_trained[i] if before[i] is not None or ids[i] in launched else None for i in keep)
    return replace(
        scenario, rates=subset(scenario.rates), planning_rates=subset(scenario.planning_rates),
        true_epochs=tuple(scenario.true_epochs[i] for i in keep),
        epochs_estimate=tuple(scenario.epochs_estimate[i] for i in keep), resumed=resumed,
        curves=tuple(scenario.curves[i] for i in keep) if scenario.curves else (),
        visited=tuple(result.visited[i] for i in keep) if result.visited else (),
    )


def _groups(rates: RateTable) -> dict[str, str]:
    """Each model's group (learning over groups), where it has one: early stopping's cohorts."""
    return {model: group for model in rates.ids if (group := group_of(rates, model)) is not None}


def join_wait(costs: Overheads, stream) -> float:
    """Seconds a member joining `stream` now waits for it to pass the costs' `join_samples`
    (real samples, at its pace now; none where it does not move yet)."""
    if not costs.join_samples or not stream.active or stream.pace <= 0:
        return 0.0
    return costs.join_samples * stream.decode_scale / stream.pace


class _Run:
    """One simulated run: the `World` its `Driver` runs the policy in; :meth:`run` is the
    event loop. It supplies virtual time (`EventQueue`) and the physics of streams
    (`StreamPhysics`); the driver and its ledger keep every model's state, epochs and visits."""

    def __init__(self, policy: Policy, scenario: Scenario, overheads: Overheads, interrupt_at: float | None = None,
                 adapt: AdapterFactory | None = None, early_stop: EarlyStopSettings | None = None):
        self.scenario, self.costs, self.interrupt_at = scenario, overheads, interrupt_at
        self.cluster = scenario.cluster
        self.n = scenario.rates.samples_per_epoch
        self.ledger = self._ledger(scenario)
        adapter = adapt(self.ledger, policy, self, overheads) if adapt is not None else None
        early = None if early_stop is None else create_early_stopping(early_stop, self.ledger.rates.ids,
                                                                      _groups(self.ledger.rates))
        self.rung_decisions: list[RungDecision] = []
        self.driver = Driver(policy, self.ledger, self, adapter, early)
        self.switches: list[SwitchRecord] = []
        self.rates_adopted = 0
        self.queue = EventQueue()
        # the driver gives a hopping policy partitions on whole data too: the ledger's are the run's
        self.physics = StreamPhysics(scenario, self.ledger.partitions, self.queue,
                                     lambda model_id: self.ledger.model(model_id).epochs_done)
        self.round_start = 0.0
        self.rounds: list[RoundRecord] = []
        self.planning: list[float] = []
        self.checkpoints = 0
        self.hops = 0

    def _ledger(self, scenario: Scenario) -> Ledger:
        shown = scenario.rates if scenario.planning_rates is None else scenario.planning_rates
        resumed = [(p.id, done) for p, done in zip(shown.models, scenario.resumed) if done is not None]
        return Ledger(
            shown, scenario.epochs_estimate, self.cluster.total_gpus, self.cluster.gpus_per_node,
            epochs_done={model: int(done + EPS) for model, done in resumed}, paused=[model for model, _ in resumed],
            decode_rate=scenario.decode_rate, partitions=self._partitions(scenario),
            visited=dict(zip(shown.ids, scenario.visited)),
        )

    def _partitions(self, scenario: Scenario) -> Partitions | None:
        if not scenario.partition_sizes:
            return None
        return Partitions(tuple(scenario.partition_sizes), self.cluster.gpus_per_node, self.cluster.nodes,
                          scenario.partition_groups)

    # -- the loop --------------------------------------------------------------------

    def run(self) -> SimResult:
        if self.interrupt_at is not None:
            self.queue.push(self.interrupt_at, INTERRUPT, ())
        self.driver.start()
        models = len(self.physics.models)
        while not self.driver.finished:
            if not self.queue:  # the driver saw no stall, yet nothing is left to happen
                raise RuntimeError(f"simulator: no event pending with {self.ledger.unfinished} models left")
            self._dispatch(*self.queue.pop())
            if self.checkpoints - self.hops > 100 * models:  # hops are the plan, not churn
                raise PolicyError(f"{self.driver.name}: more than {100 * models} checkpoints")
        return _summarize(self)

    def _dispatch(self, kind: int, payload: tuple) -> None:
        if kind == START:
            self.physics.start_members(*payload)
        elif kind == CHECKPOINT_DONE:
            self._finish_checkpoint(*payload)
        elif kind == BOUNDARY:
            self._stream_boundary(*payload)
        else:
            self.driver.interrupt()

    # -- the World the driver calls ------------------------------------------------------

    def now(self) -> float:
        return self.queue.now

    def round_ending(self, index: int) -> None:
        pass

    def checkpoint(self, model_id: str) -> None:
        model = self._model(model_id)
        done = self.now() + self.costs.checkpoint_s(model.param_bytes)
        stream = model.stream
        stream.sync(self.now())
        if model.index in stream.active and stream.progress(model) >= (model.true_epochs - EPS) * self.n:
            self._converge(stream, model)  # its last epoch ended at this instant
            return
        if model.index in stream.active:
            epoch = self._epoch_ending_now(stream, model)
            self.physics.leave(stream, model, Outcome.CHECKPOINTED, released=done)
            if epoch is not None:  # reported as the runtime's master reports it: just before it leaves
                self.driver.rate_measured(model.id, model.own_rate)
                self.driver.epoch_completed(model.id, epoch, model.own_rate, _metric(self.scenario, model.index, epoch),
                                            _rung_metric(self.scenario, model.index))
        else:  # still waiting to start: nothing trained, but the GPUs were held
            self.physics.members.append(
                MemberRecord(
                    model.id, stream.id, stream.round, model.gpus, model.launched, self.now(),
                    self.now(), done, Outcome.CHECKPOINTED, model.samples / self.n, model.samples / self.n,
                )
            )
            stream.waiting.pop(model.index, None)
            self.physics.close_if_empty(stream)
        if stream.partition is not None:  # the checkpoint signal: the visit in flight is dropped
            model.samples = model.visit_start
        self._hop_away(model, done)

    # -- early stopping (the driver's `RungKeeper` decides) ----------------------------------

    def record_rungs(self, decisions: Sequence[RungDecision]) -> None:
        self.rung_decisions.extend(decisions)

    def stop(self, model_id: str) -> None:
        """Stopped at the rung it has just reached: it leaves its stream at once."""
        model = self._model(model_id)
        rate, stream = model.own_rate, model.stream
        self.physics.leave(stream, model, Outcome.STOPPED, released=self.now())
        self.physics.release(model)
        self.driver.stopped(model.id, self.ledger.model(model.id).epochs_done, rate)

    def rung_passed(self, model_id: str) -> None:
        pass  # a simulated model never waits at a rung for its verdict

    # -- the AdaptNotes the adapter tells ----------------------------------------------------

    def rates_refined(self, changes: tuple[RateChange, ...], verdict: Refinement | None) -> None:
        self.rates_adopted += 1

    def rates_kept(self, verdict: Refinement) -> None:
        pass

    def policy_switched(self, switch: PolicySwitch, at: float) -> None:
        self.switches.append(SwitchRecord(at, switch.current, switch.to))

    def _hop_away(self, model: ModelMotion, done: float) -> None:
        """The model left its stream and is checkpointed until `done`."""
        model.stream = None
        model.generation += 1
        model.has_checkpoint = True
        self.checkpoints += 1
        self.queue.push(done, CHECKPOINT_DONE, (model.index,))

    def launch(self, launches: Sequence[Launch], new_round: bool, planning_s: float) -> None:
        if new_round:
            if self.ledger.launches > 1:
                self.rounds.append(RoundRecord(self.ledger.round - 1, self.round_start, self.physics.last_release))
            self.round_start = self.now()
        self.planning.append(planning_s if self.costs.planning_s is None else self.costs.planning_s)
        delay = self.planning[-1]
        new_streams = sum(not launch.join for launch in launches)
        for launch in launches:
            ready = [self._reserve(model, member.gpus, delay, member.models)
                     for member in launch.members for model in member.ids]
            if not launch.join:
                stream = self.physics.new_stream(launch.stream, self.ledger.round, launch.partition,
                                                 launch.own_decoding, [m.gpus for m in launch.members], new_streams)
                self.physics.wait(stream, ready, max(r for _, r in ready))
            else:
                stream = self.physics.streams[launch.stream]
                joined = self.now() + join_wait(self.costs, stream)
                for model, when in ready:
                    self.physics.wait(stream, [(model, max(when, joined))], max(when, joined))

    def _reserve(self, model_id: str, gpus: tuple[int, ...], delay: float,
                 bundle: tuple[str, ...] = ()) -> tuple[ModelMotion, float]:
        """`model_id` reserves `gpus` (with the models of its `bundle`, which train at the
        bundle's rate: a step of each in turn); when it can start."""
        model = self._model(model_id)
        restore = self.costs.restore_s(model.param_bytes) if model.has_checkpoint else 0.0
        model.gpus = tuple(gpus)
        model.generation += 1
        model.launched = self.now()
        model.visit_start = model.samples
        model.trainer_share = 1.0 / max(1, len(bundle))
        model.own_alone_rate = model.own_rate = (bundle_rate(self.scenario.rates, bundle) if bundle else
                                                 self.scenario.rates.rate(model.id, len(gpus)))
        if self.scenario.cores is not None:
            model.own_rate = self.scenario.cores.member_rate(model.own_alone_rate, len(gpus))
        return model, self.now() + delay + restore + self.costs.start_s

    def _epoch_ending_now(self, stream: StreamMotion, model: ModelMotion) -> int | None:
        """The epoch (not its last) that `model` ends at this very instant, its boundary not yet
        taken from the queue (a model checkpointed by the event of a stream-mate whose epoch
        ended with its own); None otherwise. Visits end at their own events."""
        if stream.partition is not None:
            return None
        samples = stream.progress(model)
        epoch = round(samples / self.n)
        if abs(samples - epoch * self.n) > EPS * self.n or epoch <= self.ledger.model(model.id).epochs_done:
            return None
        return epoch

    # -- event handlers --------------------------------------------------------------

    def _stream_boundary(self, stream_id: int, version: int) -> None:
        stream = self.physics.streams.get(stream_id)
        if stream is None or stream.version != version:
            return
        stream.sync(self.now())
        reached = self.physics.boundary_reached(stream)
        if reached is None:  # a member's lead reached the cap: it moves at the pace from now
            self.physics.repace(stream)
            return
        _, index, _, epoch = reached
        model = self.physics.models[index]
        if stream.partition is not None:
            self._visit_end(stream, model)
            return
        if epoch >= model.true_epochs:
            self._converge(stream, model)
            return
        stream.push_boundary(model, epoch + 1, self.n)
        self.physics.repace(stream)
        self.driver.rate_measured(model.id, model.own_rate)
        self.driver.epoch_completed(model.id, epoch, model.own_rate, _metric(self.scenario, index, epoch),
                                    _rung_metric(self.scenario, index))

    def _visit_end(self, stream: StreamMotion, model: ModelMotion) -> None:
        """`model` passed over its stream's partition: its epoch may end; it converges or hops."""
        ended = self.ledger.visit_ends_epoch(model.id, stream.partition)
        epochs = self.ledger.model(model.id).epochs_done + ended
        if ended and epochs >= model.true_epochs:
            self._converge(stream, model)
            return
        rate = model.own_rate
        done = self.now() + self.costs.checkpoint_s(model.param_bytes)
        self.physics.leave(stream, model, Outcome.HOPPED, released=done)
        model.samples = model.visit_start + self.ledger.partitions.visit_samples(group_of(self.scenario.rates, model.id),
                                                                                stream.partition)
        self._hop_away(model, done)
        self.hops += 1
        metric = _metric(self.scenario, model.index, epochs) if ended else None
        if ended:
            self.driver.rate_measured(model.id, rate)
        self.driver.visit_completed(model.id, stream.partition, epochs, rate, metric,
                                    _rung_metric(self.scenario, model.index) if ended else None)

    def _converge(self, stream: StreamMotion, model: ModelMotion) -> None:
        rate = model.own_rate
        self.driver.rate_measured(model.id, rate)
        self.physics.leave(stream, model, Outcome.CONVERGED, released=self.now())
        self.physics.release(model)
        self.driver.converged(model.id, model.true_epochs, rate)

    def _finish_checkpoint(self, index: int) -> None:
        model = self.physics.models[index]
        self.physics.release(model)
        self.driver.checkpointed(model.id, self.ledger.model(model.id).epochs_done)

    def _model(self, model_id: str) -> ModelMotion:
        return self.physics.models[self.ledger.rates.index(model_id)]


def _metric(scenario: Scenario, index: int, epoch: int) -> float | None:
    """The validation metric model `index` reports after `epoch`, where the scenario has curves."""
    return scenario.curves[index][epoch - 1] if scenario.curves else None


def _rung_metric(scenario: Scenario, index: int) -> float | None:
    """What early stopping ranks model `index` by where the scenario has no curves (None where
    it has): a stand-in that predicts how many models survive each rung, not which (the rung
    arithmetic). A fixed draw per model, spread evenly over [0, 1) in an order unrelated to the
    models' rates or places, so that ASHA's newcomer is in a rung's top 1/η about 1/η of the
    time, as for real metrics, and not never (as unknown metrics, all tied, would make it).
    Policies never see it: their epochs report no metric, as before."""
    return None if scenario.curves else (index * GOLDEN_FRACTION) % 1.0


GOLDEN_FRACTION = 0.6180339887498949
"""The golden ratio's fraction: index × it mod 1 spreads any count of models evenly over [0, 1)."""


def _summarize(run: _Run) -> SimResult:
    """The result of a run that ended."""
    makespan = run.now()
    physics, ledger = run.physics, run.ledger
    run.rounds.append(RoundRecord(ledger.round, run.round_start, makespan))
    streams = sorted(physics.finished_streams + list(physics.streams.values()), key=lambda s: s.id)
    records = tuple(
        StreamRecord(s.id, s.round, s.start if s.start is not None else s.end, s.end,
                     tuple(s.all_members), max(s.pos, s.front) / s.decode_scale)  # grouped: real samples
        for s in streams
    )
    members = tuple(sorted(physics.members, key=lambda r: (r.launched, r.stream, r.model)))
    gpu_time_, idle = gpu_time(members, sum(s.slack for s in streams), run.cluster.total_gpus, makespan)
    views = [ledger.model(m.id) for m in physics.models]
    return SimResult(
        run.driver.name, run.cluster.total_gpus, makespan, len(run.rounds),
        float(sum(r.samples_decoded for r in records)), gpu_time_, idle, tuple(run.planning),
        run.checkpoints, Timeline(tuple(run.rounds), records, members),
        ledger.unfinished > 0, tuple(m.samples / run.n for m in physics.models), run.hops,
        tuple(() if v.state is ModelState.CONVERGED else v.visited for v in views)
        if ledger.partitions is not None else (), tuple(run.switches), run.rates_adopted, tuple(run.rung_decisions),
    )
