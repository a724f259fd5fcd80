"""Rate self-tuning on rank 0: fold measured training rates into the plan when that pays.

Every epoch report carries the model's measured rate on its GPU count. Before the policy may
plan (after a convergence or a checkpoint), the rates measured so far are proposed as a new
table and weighed in the simulator (`fleet.schedule.refine`): adopted only when the predicted
gain beats the cost of the change at this run's own checkpoint and start costs. A proposal
within `MIN_CHANGE` of one already turned down is not weighed again, nor are rates weighed
where they cannot change a plan (a policy that never reads them, or one that plans only on a
drained cluster while the cluster is not drained, or would plan the same either way). A
hopping policy plans each visit afresh, and every visit ends with a checkpoint: its measured
rates are adopted unweighed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from fleet.runtime.control.console import Console
from fleet.runtime.events import EventLog
from fleet.schedule import ModelState, Policy
from fleet.schedule.costs import Overheads
from fleet.schedule.ledger import Ledger
from fleet.schedule.rates import RateTable
from fleet.schedule.refine import (
    RateChange,
    RateRefiner,
    Refinement,
    makespan_simulator,
    rate_changes,
    weigh_refinement,
)


class RateTuner:
    """Weighs measured rates for one run's policy and adopts them into its `Ledger`.

    Args:
        ledger: the run's books; an adopted table becomes `ledger.rates`.
        policy: the running policy (its flags say when rates can matter to it).
        make_policy: a fresh policy of the same kind, for the simulations.
        costs: the run's measured overheads so far (called at each weighing).
        log, console: where verdicts are written and shown.
    """

    def __init__(self, ledger: Ledger, policy: Policy, make_policy: Callable[[], Policy],
                 costs: Callable[[], Overheads], log: EventLog, console: Console):
        self.ledger, self.policy, self.make_policy, self.costs = ledger, policy, make_policy, costs
        self.log, self.console = log, console
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
        self.log.write("rates_refined", changes=_shown(changes), at_hops=True)
        self.console.banner(f"rates refined for the next visits: {_summary(changes)}")

    def _same_next_plan(self, proposal: RateTable, now: float) -> bool:
        """Whether the plan about to be made on this drained cluster is the same on either
        table; then the proposal waits, at no loss, to be weighed before the next one."""
        view = self.ledger.view(now)
        plans = [self.make_policy().start(replace(view, rates=table)) for table in (view.rates, proposal)]
        return plans[0] == plans[1]

    def _settle(self, proposal: RateTable, verdict: Refinement) -> None:
        changes = verdict.changes
        self.log.write("rates_refined" if verdict.adopt else "rates_kept", changes=_shown(changes),
                       predicted_keep_s=verdict.predicted_keep_s, predicted_new_s=verdict.predicted_new_s,
                       gain_s=verdict.gain_s, cost_s=verdict.cost_s)
        summary = (f"{_summary(changes)}; predicted gain {verdict.gain_s:.1f} s vs cost {verdict.cost_s:.1f} s")
        if verdict.adopt:
            self.ledger.rates = proposal
            self.rejected = None
            self.console.banner(f"rates refined: {summary}")
        else:
            self.rejected = proposal
            self.console.banner(f"rates kept: {summary}")


def _shown(changes: Sequence[RateChange]) -> list[dict]:
    return [{"model": c.model, "gpus": c.m, "old": round(c.old, 1), "new": round(c.new, 1)} for c in changes]


def _summary(changes: Sequence[RateChange]) -> str:
    worst = max(changes, key=lambda c: abs(c.relative))
    return (f"{len(changes)} rate(s) moved >= 10% (e.g. {worst.model} on {worst.m} GPU(s): {worst.old:,.0f} -> "
            f"{worst.new:,.0f} samples/s)")
