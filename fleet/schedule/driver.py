"""The one driver of the policy protocol: events in, policy calls, decisions checked and applied.

Both places that run a policy -- the discrete-event simulator (virtual time, modelled
training) and the MPI runtime's coordinator (real time, messages to ranks) -- drive it through
a `Driver`. The driver owns the books (a `Ledger`), builds every view, calls the policy, checks
each decision against the protocol (`fleet/schedule/_base.py`), applies it to the books,
counts rounds and detects stalls, with one set of errors (`PolicyError`). What differs between
the two is a `World`: it says what time it is and carries the decisions out.

Calls from the world (one thread; each may call back into the world before it returns)
    ``start()`` once; then, as things happen, ``epoch_completed``, ``converged``,
    ``checkpointed``, ``rate_measured`` (a model's samples/s over an epoch, for the adapter),
    ``rates_estimated`` (models' rates estimated anew before they report any: an adaptive
    search's models, once asked),
    and with partitioned data ``visit_completed`` (a visit ended: the world
    hops the model by itself and reports ``checkpointed``, or ``converged`` instead of both
    when the stop rule ended it there); ``interrupt()`` on the checkpoint signal (every running model is
    checkpointed, and the policy is not asked again). The books take each report in at once;
    a report made while a decision is being applied (a model whose last epoch ends just as
    it is checkpointed) reaches the policy right after that decision.

Calls into the world, in this order within one decision
    ``round_ending(index)`` for ``end_round``; ``checkpoint(model)`` per model to checkpoint
    (the books already hold it ``CHECKPOINTING``); ``launch(launches, new_round, planning_s)``
    once for all the decision's streams (the books already hold the members ``RUNNING`` on
    their GPUs).

Between the books and the policy
    With an `Adapter` (`fleet.schedule.adapting`), each convergence and checkpoint is weighed
    before the policy sees it: measured rates may be adopted into the books, and under
    ``policy: auto`` the run may be handed to another policy (`switch_policy`). The runtime
    always adapts; the simulator when asked to (`fleet simulate --true-rates`), so that it
    predicts the same decisions.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from fleet.schedule._base import (
    CheckpointCompleted,
    ClusterView,
    Decision,
    EpochCompleted,
    Event,
    Member,
    ModelConverged,
    ModelPromoted,
    ModelState,
    Policy,
    PolicyError,
)
from fleet.schedule.early_stop import EarlyStopping, RungDecision, Verdict
from fleet.schedule.grouping import check_one_group
from fleet.schedule.ledger import Ledger, describe_books, stream_partition
from fleet.schedule.partitions import Partitions
from fleet.schedule.rates import reestimated
from fleet.schedule.rung_keeper import RungKeeper

if TYPE_CHECKING:  # annotations only: the adapter's simulations import this module
    from fleet.schedule.adapting import Adapter

STALL_NAMES = 8
"""Models a stall's error names (the rest are counted)."""


@dataclass(frozen=True)
class Launch:
    """One stream of a decision, as the books now hold it.

    Attributes:
        stream: the stream's id (a new one, or the running stream joined).
        members: the models and their GPUs.
        join: True when the members join the running stream ``stream``.
        partition: with partitioned data, the partition the members visit; else None.
        own_decoding: the one member decodes the stream in its own trainer process.
    """

    stream: int
    members: tuple[Member, ...]
    join: bool
    partition: int | None = None
    own_decoding: bool = False


class World(Protocol):
    """What a driver needs from the place it runs a policy in."""

    def now(self) -> float:
        """Seconds since the start of the run."""

    def round_ending(self, index: int) -> None:
        """The policy ended round `index`: its running models are checkpointed next."""

    def checkpoint(self, model: str) -> None:
        """Checkpoint a model the books now hold ``CHECKPOINTING`` and take it off its GPUs;
        report `Driver.checkpointed` when done (or `Driver.converged`, when its last epoch
        ended at that very moment). With partitioned data only the checkpoint signal asks
        this: the visit in flight is dropped and the model goes back to its last hop."""

    def launch(self, launches: Sequence[Launch], new_round: bool, planning_s: float) -> None:
        """Start the decision's streams and joins; `planning_s`: the policy call's duration."""

    # with early stopping only (`Driver`'s ``early``):

    def record_rungs(self, decisions: Sequence[RungDecision]) -> None:
        """Keep the rung decisions, before any of them acts (a requeued job replays them)."""

    def stop(self, model: str) -> None:
        """End a running model's training at the epoch it has just reported (early stopping);
        report `Driver.stopped` when its GPUs are free."""

    def rung_passed(self, model: str) -> None:
        """The running model may train on past the rung it has just reached."""


def check_decision(decision: object, name: str, ledger: Ledger) -> None:
    """Raise `PolicyError` where policy `name`'s `decision` cannot be carried out on `ledger`'s books."""
    if not isinstance(decision, Decision):
        raise PolicyError(f"{name}: returned {decision!r}, not a Decision")
    if decision.end_round and (decision.launch or decision.checkpoint):
        raise PolicyError(f"{name}: end_round cannot be combined with other actions")
    if ledger.partitions is not None and (decision.end_round or decision.checkpoint):
        raise PolicyError(f"{name}: visits of partitioned data are not cut short (no checkpoint, no end_round)")
    for model in decision.checkpoint:
        state = ledger.model(model).state
        if state is not ModelState.RUNNING:
            raise PolicyError(f"{name}: cannot checkpoint {model}, it is {state.value}")
    if decision.launch:
        ledger.check_launch(decision.launch, name, decision.checkpoint)
        check_one_group(decision.launch, name, ledger.rates, ledger.streams)  # data.group_by


class Driver:
    """Runs one policy over one `Ledger` in one `World`; see the module docstring.

    Attributes:
        ledger: the books.
        planning_s: seconds spent in policy calls so far.
        interrupted: the checkpoint signal came; nothing new starts.
        adapter: weighs measured rates (and ``policy: auto``'s choice) before each policy
            call, or None.
        rungs: early stopping across models (`RungKeeper`, from ``early``), or None.
    """

    def __init__(self, policy: Policy, ledger: Ledger, world: World, adapter: Adapter | None = None,
                 early: EarlyStopping | None = None):
        self.policy, self.ledger, self.world, self.adapter = policy, ledger, world, adapter
        self.rungs = RungKeeper(early, ledger, world) if early is not None else None
        if ledger.partitions is not None and not (policy.hops or policy.visits_groups and ledger.partitions.groups):
            raise PolicyError(f"{policy.name} does not plan visits of partitioned data (a hopping policy does)")
        if ledger.partitions is None and policy.hops:  # whole data: one partition on every node
            nodes = -(-ledger.total_gpus // ledger.gpus_per_node)
            ledger.partitions = Partitions((float(ledger.rates.samples_per_epoch),), ledger.gpus_per_node, nodes)
        self.planning_s = 0.0
        self.interrupted = False
        self._deciding = False
        self._later: deque[Event] = deque()  # events that came while a decision was applied
        self._next: Policy | None = None  # the policy the run is being handed to (`switch_policy`)

    @property
    def name(self) -> str:
        return self.policy.name

    def view(self) -> ClusterView:
        return self.ledger.view(self.world.now())

    @property
    def finished(self) -> bool:
        """The run is over: every model converged, or the checkpoint signal came and every
        checkpoint it asked for is done. Both worlds run until this holds."""
        return self.ledger.unfinished == 0 or (self.interrupted and self.ledger.drained)

    # -- from the world --------------------------------------------------------------------

    def start(self) -> None:
        """The first policy call: every GPU free, models pending or resumed (paused)."""
        self._decide(self.policy.start)
        while self._later:
            self._deliver(self._later.popleft())

    def epoch_completed(self, model: str, epoch: int, samples_per_s: float, metric: float | None = None,
                        rung_metric: float | None = None) -> None:
        """A running model finished an epoch that was not its last (`metric`: the stop rule's
        validation metric after it, lower is better, where the world knows it). With early
        stopping, the model may be stopped or held at the rung it reached (after the policy saw
        the epoch), on `rung_metric` where given (a simulation's stand-in for an unknown
        metric, which the policy never sees), else on `metric`."""
        self.ledger.epoch_done(model, epoch)
        ranked = metric if rung_metric is None else rung_metric
        verdicts = self._rung_verdicts(lambda rungs: rungs.epoch(model, epoch, ranked))
        self._notify(EpochCompleted(model, epoch, self.world.now(), samples_per_s, metric))
        self._carry_out(verdicts)

    def converged(self, model: str, epochs: int, samples_per_s: float) -> None:
        """A model finished its last epoch; its GPUs are free from now on."""
        self.ledger.epoch_done(model, epochs)
        gpus = self.ledger.release(model, ModelState.CONVERGED)
        verdicts = self._rung_verdicts(lambda rungs: rungs.ended(model, epochs))
        self._notify(ModelConverged(model, epochs, self.world.now(), gpus, samples_per_s))
        self._carry_out(verdicts)

    def stopped(self, model: str, epochs: int, samples_per_s: float) -> None:
        """A model early stopping stopped (`World.stop`) has left its GPUs after `epochs`."""
        self.ledger.epoch_done(model, epochs)
        gpus = self.ledger.release(model, ModelState.CONVERGED)
        self._notify(ModelConverged(model, epochs, self.world.now(), gpus, samples_per_s, stopped=True))

    def visit_completed(
        self, model: str, partition: int, epochs: int, samples_per_s: float, metric: float | None = None,
        rung_metric: float | None = None,
    ) -> None:
        """A running model finished its visit of `partition` and hops (the world checkpoints
        it by itself and reports `checkpointed`); `epochs`: its epochs done after the visit,
        one more when the visit ended an epoch (`metric`, `rung_metric` as in `epoch_completed`)."""
        if self.ledger.visit_done(model, partition):
            self.ledger.epoch_done(model, epochs)
            ranked = metric if rung_metric is None else rung_metric
            verdicts = self._rung_verdicts(lambda rungs: rungs.epoch(model, epochs, ranked))
            self._notify(EpochCompleted(model, epochs, self.world.now(), samples_per_s, metric))
            self._carry_out(verdicts)

    def rate_measured(self, model: str, samples_per_s: float) -> None:
        """A running model trained at `samples_per_s` over its last epoch, on its GPUs now."""
        if self.adapter is None:
            return  # every epoch of every simulation passes here: nothing to look up without one
        gpus = len(self.ledger.model(model).gpus)
        if gpus:
            self.adapter.observe(model, gpus, samples_per_s)

    def rates_estimated(self, factors: Mapping[str, float]) -> None:
        """Models of `factors` train at their planned rates times their factor (an adaptive search
        asked their architecture, `fleet.schedule.rates.reestimated`; a bundle's trial measured the
        way it trains, `fleet.schedule.bundle_ways.decided_factors`): the books plan with that
        from now on, and the adapter measures them on their own."""
        self.ledger.rates = reestimated(self.ledger.rates, factors)
        if self.adapter is not None:
            self.adapter.part(factors)

    def checkpointed(self, model: str, epochs: int) -> None:
        """A model's checkpoint is done: it is paused (held at a rung, or stopped, where early
        stopping decided so meanwhile) and its GPUs are free."""
        self.ledger.epoch_done(model, epochs)
        state, promoted = (ModelState.PAUSED, False) if self.rungs is None else self.rungs.checkpointed_state(model)
        gpus = self.ledger.release(model, state)
        if promoted:  # it was held at its rung, and the rung filled meanwhile
            self._later.append(ModelPromoted(model, self.world.now()))
        if state is ModelState.CONVERGED:
            self._notify(ModelConverged(model, epochs, self.world.now(), gpus, 0.0, stopped=True))
        else:
            self._notify(CheckpointCompleted(model, self.world.now(), gpus))

    def switch_policy(self, policy: Policy) -> list[str]:
        """Hand the run to `policy` (``policy: auto`` re-deciding): every running model is
        checkpointed as at the end of a round, the old policy is not asked again, and once no
        model runs or checkpoints `policy.start` plans the rest. Returns the models checkpointed."""
        if policy.hops != self.policy.hops:
            raise PolicyError(f"{self.name}: cannot hand the run to {policy.name} (hopping and non-hopping policies)")
        self._next = policy
        running = self.ledger.ids_in(ModelState.RUNNING)
        if running:
            self.world.round_ending(self.ledger.round)
        for model in running:
            self._checkpoint(model)
        if not self._deciding:
            self._hand_over()
        return running

    def interrupt(self) -> list[str]:
        """The checkpoint signal: checkpoint every running model; returns them."""
        self.interrupted = True
        running = self.ledger.ids_in(ModelState.RUNNING)
        for model in running:
            self._checkpoint(model)
        return running

    # -- early stopping's verdicts ----------------------------------------------------------

    def _rung_verdicts(self, ask: Callable[[RungKeeper], dict[str, Verdict]]) -> dict[str, Verdict]:
        """Early stopping's verdicts on an event (none without it); the events of models held at
        a rung are queued ahead of the policy's next call (`RungKeeper.settle_held`)."""
        if self.rungs is None:
            return {}
        verdicts = ask(self.rungs)
        self._later.extend(self.rungs.settle_held(verdicts, self.world.now()))
        return verdicts

    def _carry_out(self, verdicts: dict[str, Verdict]) -> None:
        if verdicts:
            self.rungs.carry_out(verdicts, self._checkpoint)

    # -- policy calls ----------------------------------------------------------------------

    def _notify(self, event: Event) -> None:
        if self._deciding:  # the world reported it while applying a decision: it comes next
            self._later.append(event)
            return
        self._deliver(event)
        while self._later:
            self._deliver(self._later.popleft())

    def _deliver(self, event: Event) -> None:
        if self.interrupted:
            return
        asked = self.policy
        if self.adapter is not None:
            self.adapter.before_policy(event, self)
        if self._next is not None or self.policy is not asked:  # the world switched policies: the event is the old one's
            self._hand_over()
            return
        self._decide(lambda view: self.policy.on_event(event, view))

    def _hand_over(self) -> None:
        """The new policy's first call, once the old one's models are all checkpointed."""
        if self._next is None or self.ledger.ids_in(ModelState.RUNNING, ModelState.CHECKPOINTING):
            return
        self.policy, self._next = self._next, None
        self._decide(self.policy.start)

    def _decide(self, call: Callable[[ClusterView], Decision]) -> None:
        if self.interrupted:
            return  # winding down after the checkpoint signal: nothing new starts
        self._deciding = True
        try:
            self._call(call)
        finally:
            self._deciding = False

    def _call(self, call: Callable[[ClusterView], Decision]) -> None:
        view = self.view()
        began = time.perf_counter()
        decision = call(view)
        elapsed = time.perf_counter() - began
        self.planning_s += elapsed
        check_decision(decision, self.name, self.ledger)
        self._apply(decision, elapsed)
        if self._stalled():
            raise self.stalled_error("nothing runs or checkpoints and it launched nothing")

    def _stalled(self) -> bool:
        """No model runs or checkpoints (so no report is due), nothing is about to be reported,
        and models are left. By the models' states, not the GPUs: a GPU the books hold for no
        model must not hide a stall."""
        return not self.ledger.active and not self._later and not self.finished

    def stalled_error(self, why: str) -> PolicyError:
        """The one-line error of a run that can go no further (`why`): the policy, the models
        left (the first few named) and the books."""
        left = [v.id for v in self.ledger.views if v.state is not ModelState.CONVERGED]
        named = ", ".join(left[:STALL_NAMES])
        if len(left) > STALL_NAMES:
            named += f" and {len(left) - STALL_NAMES} more"
        models = "1 model" if len(left) == 1 else f"{len(left)} models"
        return PolicyError(f"{self.name}: stalled with {models} left ({named}): {why}; "
                           f"the books: {describe_books(self.ledger)}")

    def _apply(self, decision: Decision, planning_s: float) -> None:
        if decision.end_round:
            self.world.round_ending(self.ledger.round)
            targets = self.ledger.ids_in(ModelState.RUNNING)
        else:
            targets = list(decision.checkpoint)
        for model in targets:
            self._checkpoint(model)
        if decision.launch:
            self._launch(decision, planning_s)

    def _checkpoint(self, model: str) -> None:
        self.ledger.start_checkpoint(model)
        self.world.checkpoint(model)

    def _launch(self, decision: Decision, planning_s: float) -> None:
        new_round = self.ledger.begin_launch()
        launches = []
        for plan in decision.launch:
            stream = self.ledger.open_stream() if plan.join is None else plan.join
            for member in plan.members:
                for model in member.ids:  # a bundle's models hold its GPUs together
                    self.ledger.reserve(model, member.gpus, stream)
            launches.append(Launch(stream, plan.members, plan.join is not None,
                                   stream_partition(plan, self.ledger.partitions), plan.own_decoding))
        self.world.launch(launches, new_round, planning_s)
