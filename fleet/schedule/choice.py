"""``policy: auto``: the policy predicted to finish this ensemble first on this allocation (pure).

Each candidate runs the same scenario in the simulator (the rates, the epochs estimates, the
GPUs, decoding as measured) with its default options; the one with the lowest predicted
makespan is chosen, ties going to the candidate listed first. A small ensemble on a few GPUs
may finish first under `baseline` (no stream to pace, no regrouping); a large one under a FLEET
policy: which, the prediction says, not a rule of thumb.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from fleet.schedule._base import ClusterView, ModelState, Policy
from fleet.schedule.costs import Overheads
from fleet.schedule.early_stop import EarlyStopSettings
from fleet.schedule.planners import policy_class
from fleet.schedule.simulator import Cluster, Scenario, simulate, whole_epochs

AUTO = "auto"
CANDIDATES = ("fleet-g", "fleet-adaptive", "fleet-l", "homogeneous", "baseline")
"""What ``auto`` chooses from, in order of preference on a tie."""

PREDICTION_COSTS = Overheads(latency_s=0.5)
"""The checkpoint and restore costs predictions assume: 0.5 s + 3 x parameter bytes at 1 GB/s."""


PREDICTION_BUDGET_S = 60.0
"""Seconds ``auto`` may spend simulating its candidates, together (`simulation_cost_s`)."""

SIMULATION_COST_S = {
    "baseline": (0.22, 0.083), "homogeneous": (0.075, 0.225), "fleet-g": (0.62, 0.083), "fleet-l": (0.36, 0.142),
    "fleet-adaptive": (0.0, 2.2),
}
"""Per policy, what one simulation costs (CPU seconds on the 2-core machine of bench/sched_scale.py,
the ``scale`` workload at 1,000, 4,000 and 10,000 models on as many GPUs) per 1,000 models and per
1,000 models x 1,000 of them running at once, at 25 epochs a model. The hopping policies are not
priced: `affordable` always keeps them."""


@dataclass(frozen=True)
class PolicyChoice:
    name: str
    predicted_s: dict[str, float]  # each candidate's predicted makespan, seconds
    skipped: tuple[str, ...] = ()  # candidates too large to simulate within the prediction budget

    def describe(self) -> str:
        """``fleet-g (predicted 13.0 s; fleet-adaptive 13.4 s, baseline 9.9 s, ...)``, and the
        candidates it did not predict."""
        others = ", ".join(f"{n} {s:,.1f} s" for n, s in self.predicted_s.items() if n != self.name)
        skipped = (f"; not predicted, too large to simulate within {PREDICTION_BUDGET_S:.0f} s: "
                   f"{', '.join(self.skipped)}" if self.skipped else "")
        return f"{self.name} (predicted {self.predicted_s[self.name]:,.1f} s{'; ' if others else ''}{others}{skipped})"


def choose_policy(make_policy: Callable[[str], Policy], scenario: Scenario, overheads: Overheads = PREDICTION_COSTS,
                  candidates: Sequence[str] = CANDIDATES, early_stop: EarlyStopSettings | None = None,
                  budget_s: float = PREDICTION_BUDGET_S) -> PolicyChoice:
    """The candidate with the lowest predicted makespan on `scenario`; `make_policy(name)` gives
    a fresh policy object of each. With `early_stop`, each candidate runs with the models
    stopped and held at rungs (`simulate`'s; without learning curves, the rung arithmetic).
    Candidates whose simulations would take the predictions past `budget_s` are skipped
    (`affordable`)."""
    chosen = affordable(candidates, scenario, budget_s)
    choice = pick({name: simulate(make_policy(name), scenario, overheads, early_stop=early_stop).makespan
                   for name in chosen}, chosen)
    return replace(choice, skipped=tuple(n for n in candidates if n not in chosen))


def affordable(candidates: Sequence[str], scenario: Scenario, budget_s: float = PREDICTION_BUDGET_S) -> list[str]:
    """The candidates (in their order) whose simulations of `scenario` fit `budget_s` together,
    the cheapest first (`simulation_cost_s`); the cheapest one where none does. A candidate
    `SIMULATION_COST_S` does not price is always kept."""
    costs = {name: simulation_cost_s(name, scenario) for name in candidates}
    kept, spent = set(), 0.0
    for name in sorted(candidates, key=costs.__getitem__):  # sorted keeps the order of equals
        if spent + costs[name] <= budget_s:
            kept.add(name)
            spent += costs[name]
    return [name for name in candidates if name in kept] or [min(candidates, key=costs.__getitem__)]


def simulation_cost_s(policy: str, scenario: Scenario) -> float:
    """Seconds one simulation of `policy` on `scenario` is expected to take (`SIMULATION_COST_S`;
    0 for a policy it does not price)."""
    per_model, per_pair = SIMULATION_COST_S.get(policy, (0.0, 0.0))
    models = len(scenario.true_epochs) / 1000
    running = min(len(scenario.true_epochs), scenario.cluster.total_gpus) / 1000
    epochs = sum(scenario.true_epochs) / max(len(scenario.true_epochs), 1) / 25
    return (per_model * models + per_pair * models * running) * epochs


def pick(predicted: dict[str, float], candidates: Sequence[str] = CANDIDATES) -> PolicyChoice:
    """The choice among `candidates` given each one's predicted makespan (`predicted` may hold more)."""
    best = min(candidates, key=lambda name: predicted[name])  # min keeps the first of equals
    return PolicyChoice(best, {name: predicted[name] for name in candidates})


def switch_targets(started: Policy, candidates: Sequence[str] = CANDIDATES) -> tuple[str, ...]:
    """The candidates a running ``policy: auto`` job that started with `started` may hand its
    rest to: those that decode each model in its own trainer only if it started with one
    (those decoders start with the job)."""
    return tuple(n for n in candidates if started.own_decoding or not policy_class(n).own_decoding)


SWITCH_MARGIN = 0.10
"""A switch must save this share of the running policy's predicted remaining makespan, its cost
besides: predictions from rates measured over a few epochs are not exact."""


@dataclass(frozen=True)
class PolicySwitch:
    """``policy: auto`` re-deciding on measured rates: from `current` to `to`."""

    current: str
    to: str
    predicted_s: dict[str, float]  # each candidate's predicted makespan of the remaining work
    cost_s: float  # checkpointing the running models and restarting them

    def describe(self) -> str:
        others = ", ".join(f"{n} {s:,.1f} s" for n, s in self.predicted_s.items() if n not in (self.current, self.to))
        return (f"{self.to} is predicted to finish the rest in {self.predicted_s[self.to]:,.1f} s, {self.current} in "
                f"{self.predicted_s[self.current]:,.1f} s; switching costs about {self.cost_s:,.1f} s"
                + (f" (also predicted: {others})" if others else ""))


def reconsider(current: str, view: ClusterView, make_policy: Callable[[str], Policy], overheads: Overheads,
               candidates: Sequence[str], margin: float = SWITCH_MARGIN,
               current_s: float | None = None) -> PolicySwitch | None:
    """Whether ``policy: auto`` should hand the rest of the run to another candidate, now that
    `view.rates` holds measured rates: each candidate runs the models still to train (their
    estimated epochs left) in the simulator; the best one is taken when it beats the running
    policy by `margin` of that policy's prediction plus the switch's cost (the running models'
    checkpoints and restarts, in parallel). `current_s`: the running policy's predicted rest
    where it plans on (the rate tuner's: it may finish sooner going on with its plan than
    planning afresh). None: keep the running policy."""
    left = [m for m in view.models if m.state is not ModelState.CONVERGED]
    if not left or current not in candidates:
        return None
    table = view.rates.subset([m.id for m in left])
    epochs = [max(1.0, m.epochs_estimate - m.epochs_done) for m in left]
    scenario = Scenario(table, whole_epochs(epochs), tuple(epochs), Cluster(view.total_gpus, view.gpus_per_node),
                        decode_rate=view.decode_rate)
    predicted = dict(choose_policy(make_policy, scenario, overheads, candidates).predicted_s)
    if current_s is not None:
        predicted[current] = min(predicted.get(current, current_s), current_s)
    if current not in predicted:  # too large to predict: nothing to weigh a switch against
        return None
    best = pick(predicted, [name for name in candidates if name in predicted]).name
    running = any(m.state is ModelState.RUNNING for m in left)
    cost = overheads.checkpoint_s(None) + overheads.restore_s(None) + overheads.start_s if running else 0.0
    if best == current or predicted[best] + cost > (1 - margin) * predicted[current]:
        return None
    return PolicySwitch(current, best, predicted, cost)
