"""Between an event and the policy's next call: what the run has measured may change the plan.

The `Driver` calls `Adapter.before_policy` after its books took a convergence or a checkpoint
in and before the policy sees it, in the simulator as in the runtime, so `fleet simulate`
predicts what a run does when its measured rates move. Two rules live here:

Rate tuning (`RateTuner`)
    Every epoch report carries the model's measured rate on its GPU count (`Adapter.observe`).
    Before the policy may plan, the rates measured so far are proposed as a new table and
    weighed in the simulator (`fleet.schedule.refine`): adopted into the ledger only when the
    predicted gain beats the cost of the change at this run's own checkpoint and start costs.
    A proposal within `MIN_CHANGE` of one already turned down is not weighed again, nor are
    rates weighed where they cannot change a plan (a policy that never reads them, or one that
    plans only on a drained cluster while the cluster is not drained, or would plan the same
    either way). A hopping policy plans each visit afresh, and every visit ends with a
    checkpoint: its measured rates are adopted unweighed.

Reconsidering ``policy: auto`` (`PolicyReconsider`)
    Measured rates (adopted or not: they may change no plan of the running policy's) may make
    another candidate finish first (`fleet.schedule.choice.reconsider`): the run is then
    handed to it (`Driver.switch_policy`). Reconsidering takes at most `RECONSIDER_SHARE` of
    the run's time, and only when the measured rates moved since the choice was last made.

What they decide is told to the world's `AdaptNotes` (the runtime logs and prints it, the
simulator records it in its result). Nested simulations (the weighing's, the choice's) run
without an adapter.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from dataclasses import replace
from typing import TYPE_CHECKING, Protocol

from fleet.schedule._base import CheckpointCompleted, ClusterView, Event, ModelConverged, ModelState, Policy
from fleet.schedule.choice import CANDIDATES, PolicyChoice, PolicySwitch, choose_policy, reconsider, switch_targets
from fleet.schedule.costs import Overheads
from fleet.schedule.early_stop import EarlyStopSettings
from fleet.schedule.ledger import Ledger
from fleet.schedule.planners import HOPPING_POLICIES
from fleet.schedule.rates import RateTable
from fleet.schedule.refine import (
    RateChange,
    RateRefiner,
    Refinement,
    makespan_simulator,
    rate_changes,
    weigh_refinement,
)
from fleet.schedule.scenario import Scenario, whole_epochs
from fleet.schedule.sim_records import SimResult
from fleet.schedule.simulator import simulate

if TYPE_CHECKING:  # annotations only: the driver imports this module
    from fleet.schedule.driver import Driver

RECONSIDER_SHARE = 0.01
"""Of the run's time, at most, spent reconsidering ``policy: auto``'s choice."""


class AdaptNotes(Protocol):
    """What the world is told of the adapter's verdicts (the runtime: its event log and console)."""

    def rates_refined(self, changes: tuple[RateChange, ...], verdict: Refinement | None) -> None:
        """Measured rates were adopted; `verdict`: the weighing, None when adopted at hops unweighed."""

    def rates_kept(self, verdict: Refinement) -> None:
        """Measured rates were weighed and turned down."""

    def policy_switched(self, switch: PolicySwitch, at: float) -> None:
        """``policy: auto`` hands the run to another policy at `at` seconds."""


class RateTuner:
    """Weighs measured rates for one run's policy and adopts them into its `Ledger`.

    Args:
        ledger: the run's books; an adopted table becomes `ledger.rates`.
        policy: the running policy (its flags say when rates can matter to it).
        make_policy: a fresh policy of the same kind, for the simulations.
        costs: the run's overheads (called at each weighing: the runtime's are measured).
        notes: where verdicts are told.
    """

    def __init__(self, ledger: Ledger, policy: Policy, make_policy: Callable[[], Policy],
                 costs: Callable[[], Overheads], notes: AdaptNotes):
        self.ledger, self.policy, self.make_policy, self.costs, self.notes = ledger, policy, make_policy, costs, notes
        self.refiner = RateRefiner(ledger.rates)
        self.rejected: RateTable | None = None  # the last proposal weighed and not taken
        self.seconds = 0.0  # spent weighing (part of the run's planning time)

    def observe(self, model: str, gpus: int, samples_per_s: float) -> None:
        """A measured rate of `model` on `gpus` GPUs."""
        self.refiner.observe(model, gpus, samples_per_s)

    def refine(self, now: float) -> tuple[RateTable, Refinement] | None:
        """Weigh what was measured, where it could change a plan; adopt it when it pays.
        Returns the measured table it weighed (adopted or not) and the verdict, else None."""
        if not self.refiner.measured or not self.policy.uses_refined_rates:
            return None
        if self.policy.hops:
            self._adopt_at_hops()
            return None
        if self.policy.plans_only_when_drained and not self.ledger.drained:
            return None
        began = time.perf_counter()
        weighed = self.weigh(now)
        self.seconds += time.perf_counter() - began
        if weighed is None:
            return None
        self._settle(*weighed)
        return weighed

    def weigh(self, now: float) -> tuple[RateTable, Refinement] | None:
        """(proposal, verdict) over the unfinished models, or None when there is nothing new to weigh."""
        current = self.ledger.rates
        proposal = self.refiner.propose(current)
        unfinished = [v for v in self.ledger.views if v.state is not ModelState.CONVERGED]
        if not unfinished or (self.rejected is not None and not rate_changes(self.rejected, proposal)):
            return None
        ids = [v.id for v in unfinished]
        old, new = current.subset(ids), proposal.subset(ids)
        if not rate_changes(old, new) or (self.policy.plans_only_when_drained and self._same_next_plan(proposal, now)):
            return None
        remaining = [max(1.0, v.epochs_estimate - v.epochs_done) for v in unfinished]
        costs = self.costs()
        simulate = makespan_simulator(self.make_policy, self.ledger.total_gpus, costs)
        verdict = weigh_refinement(old, new, remaining, simulate, costs.checkpoint_s(None) + costs.restore_s(None))
        return None if verdict is None else (proposal, verdict)

    def _adopt_at_hops(self) -> None:
        """A hopping policy plans every visit afresh and every visit ends with a checkpoint, so
        new rates change no running plan and cost nothing: they are adopted as measured."""
        proposal = self.refiner.propose(self.ledger.rates)
        changes = rate_changes(self.ledger.rates, proposal)
        if not changes:
            return
        self.ledger.rates = proposal
        self.notes.rates_refined(changes, None)

    def _same_next_plan(self, proposal: RateTable, now: float) -> bool:
        """Whether the plan about to be made on this drained cluster is the same on either
        table; then the proposal waits, at no loss, to be weighed before the next one."""
        view = self.ledger.view(now)
        plans = [self.make_policy().start(replace(view, rates=table)) for table in (view.rates, proposal)]
        return plans[0] == plans[1]

    def _settle(self, proposal: RateTable, verdict: Refinement) -> None:
        if verdict.adopt:
            self.ledger.rates = proposal
            self.rejected = None
            self.notes.rates_refined(verdict.changes, verdict)
        else:
            self.rejected = proposal
            self.notes.rates_kept(verdict)


Reconsider = Callable[[str, ClusterView, Overheads, "float | None"], "PolicySwitch | None"]
"""``(running policy, view with measured rates, costs, its predicted rest or None) -> switch``
(`fleet.schedule.choice.reconsider` with the run's candidates)."""


class PolicyReconsider:
    """``policy: auto`` re-deciding on measured rates, within its share of the run's time.

    Args:
        rule: the `Reconsider` rule.
        policy_named: a fresh policy of a candidate's name.
        rates: the rates the first choice was made on.
    """

    def __init__(self, rule: Reconsider, policy_named: Callable[[str], Policy], rates: RateTable):
        self.rule, self.policy_named = rule, policy_named
        self.reconsidered = rates  # the rates the choice was made or last reconsidered on
        self.seconds = 0.0
        self.switches: list[PolicySwitch] = []

    def switch(self, driver: Driver, measured: RateTable, going_on: float | None, costs: Overheads) -> PolicySwitch | None:
        """The switch to make now, if any (`going_on`: the running policy's predicted rest
        where the tuner weighed it)."""
        now = driver.world.now()
        if not rate_changes(self.reconsidered, measured) or self.seconds > RECONSIDER_SHARE * now:
            return None  # nothing moved since the choice was last made, or reconsidering took its share
        self.reconsidered = measured
        began = time.perf_counter()
        switch = self.rule(driver.name, replace(driver.view(), rates=measured), costs, going_on)
        self.seconds += time.perf_counter() - began
        if switch is not None:
            self.switches.append(switch)
        return switch


class Adapter:
    """The driver's gate before each policy call; see the module docstring.

    Args:
        tuner: the run's rate tuner.
        auto: ``policy: auto``'s reconsidering, or None when the policy was named.
    """

    def __init__(self, tuner: RateTuner, auto: PolicyReconsider | None = None):
        self.tuner, self.auto = tuner, auto

    @property
    def seconds(self) -> float:
        """Spent weighing rates and reconsidering the policy (part of the run's planning time)."""
        return self.tuner.seconds + (self.auto.seconds if self.auto is not None else 0.0)

    @property
    def switches(self) -> list[PolicySwitch]:
        return self.auto.switches if self.auto is not None else []

    def observe(self, model: str, gpus: int, samples_per_s: float) -> None:
        self.tuner.observe(model, gpus, samples_per_s)

    def part(self, models: Collection[str]) -> None:
        """`models` are measured on their own from now on (`RateRefiner.part`): their rates were
        estimated anew (`Driver.rates_estimated`)."""
        self.tuner.refiner.part(models)

    def before_policy(self, event: Event, driver: Driver) -> None:
        """The books took `event` in: weigh measured rates, and reconsider the policy, where it may pay."""
        if not isinstance(event, (ModelConverged, CheckpointCompleted)):
            return
        weighed = self.tuner.refine(driver.world.now())
        if self.auto is None:
            return
        if weighed is not None:
            going_on = min(weighed[1].predicted_keep_s, weighed[1].predicted_new_s)
            self._switch(driver, weighed[0], going_on)
        elif not self.tuner.policy.uses_refined_rates:  # a policy that weighs no rate: they may still rank it
            self._switch(driver, self.tuner.refiner.propose(driver.ledger.rates), None)

    def _switch(self, driver: Driver, measured: RateTable, going_on: float | None) -> None:
        switch = self.auto.switch(driver, measured, going_on, self.tuner.costs())
        if switch is None:
            return
        self.tuner.notes.policy_switched(switch, driver.world.now())
        named = self.auto.policy_named
        self.tuner.policy, self.tuner.make_policy = named(switch.to), lambda: named(switch.to)
        driver.switch_policy(self.tuner.policy)


def simulation_adapter(policy_named: Callable[[str], Policy], candidates: tuple[str, ...] = ()):
    """An ``adapt`` factory for `fleet.schedule.simulator.simulate`: the simulated run tunes its
    rates at its own overheads as the runtime does and, given `candidates`, reconsiders
    ``policy: auto``'s choice among them (`policy_named`: a fresh policy of a name)."""

    def make(ledger: Ledger, policy: Policy, notes: AdaptNotes, overheads: Overheads) -> Adapter:
        tuner = RateTuner(ledger, policy, lambda: policy_named(policy.name), lambda: overheads, notes)
        if not candidates:
            return Adapter(tuner)

        def rule(current: str, view: ClusterView, costs: Overheads, going_on: float | None) -> PolicySwitch | None:
            return reconsider(current, view, policy_named, costs, candidates, current_s=going_on)

        return Adapter(tuner, PolicyReconsider(rule, policy_named, ledger.rates))

    return make


def simulate_auto(policy_named: Callable[[str], Policy], scenario: Scenario, overheads: Overheads,
                  interrupt_at: float | None = None,
                  early_stop: EarlyStopSettings | None = None) -> tuple[PolicyChoice, SimResult]:
    """``policy: auto`` in the simulator, as a run does it: the candidate predicted to finish
    first on what the run knows at its start (the planning rates, the estimated epochs) runs
    the scenario, adapting to the rates it measures (the scenario's true ``rates``) and
    reconsidering its choice among the candidates it may hand over to (none on partitioned
    data: visits are re-planned at every hop anyway), with `early_stop` where given (the choice
    itself is made without it, as a run makes it). Returns the first choice and the run."""
    partitioned = bool(scenario.partition_sizes)
    candidates = ("grouped",) if scenario.partition_groups else HOPPING_POLICIES if partitioned else CANDIDATES
    estimates = scenario.epochs_estimate
    known = replace(scenario, rates=scenario.planning_rates or scenario.rates, planning_rates=None,
                    true_epochs=whole_epochs(estimates), curves=())
    choice = choose_policy(policy_named, known, candidates=candidates)
    first = policy_named(choice.name)
    targets = () if partitioned else switch_targets(first, candidates)
    adapter = simulation_adapter(policy_named, targets)
    return choice, simulate(first, scenario, overheads, interrupt_at, adapter, early_stop)
