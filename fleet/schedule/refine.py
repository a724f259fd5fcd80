"""Self-tuning rates: what training measures refines the profile between rounds.

Each epoch report gives a model's samples/s on its group of m GPUs. `RateRefiner` keeps an
exponential average per (model, m) and proposes a table in which measured entries replace
the profiled ones and the other group sizes of the same model move by the same factor (the
geometric mean of measured/profiled), so the profile's scaling shape is kept. Models the
profiler timed as one (a profile entry's ``timed_as``: they differ only in how they learn) are
measured as one: their reports share the average, so the noise between copies of a sweep does
not give them rates apart and split the flotillas they were planned in.

`weigh_refinement` decides whether to plan with the proposal: it simulates the remaining
work, with the proposal as the truth, once planned on the current rates and once on the
proposal; the difference is the predicted gain. The change is taken only when that gain
exceeds its cost (checkpoint and restore of every model whose rates moved, should the new
plan place it differently).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from fleet.schedule.costs import Overheads
from fleet.schedule.rates import ModelProfile, RateTable, parted, timed_as_of
from fleet.schedule.simulator import Cluster, Scenario, simulate, whole_epochs

EMA_WEIGHT = 0.5  # weight of the newest measurement
MIN_CHANGE = 0.10  # relative change of a rate worth reporting and weighing


@dataclass(frozen=True)
class RateChange:
    model: str
    m: int
    old: float
    new: float

    @property
    def relative(self) -> float:
        return self.new / self.old - 1.0


@dataclass(frozen=True)
class Refinement:
    """The verdict on one proposal."""

    changes: tuple[RateChange, ...]
    predicted_keep_s: float
    predicted_new_s: float
    cost_s: float
    adopt: bool

    @property
    def gain_s(self) -> float:
        return self.predicted_keep_s - self.predicted_new_s


class RateRefiner:
    def __init__(self, rates: RateTable | None = None) -> None:
        """`rates`: the table whose `timed_as` entries say which models are measured as one."""
        self.measured: dict[tuple[str, int], float] = {}
        self.timed_as = timed_as_of(rates) if rates else {}

    def observe(self, model: str, m: int, rate: float) -> None:
        if not (rate > 0 and math.isfinite(rate)):
            return
        key = (self.timed_as.get(model, model), m)
        old = self.measured.get(key)
        self.measured[key] = rate if old is None else EMA_WEIGHT * rate + (1 - EMA_WEIGHT) * old

    def part(self, models: Collection[str]) -> None:
        """`models` are measured on their own from now on (`fleet.schedule.rates.parted`); what
        was measured under one of them for its group stays with the group's next member (else it
        is dropped: it was measured at the speed they leave)."""
        before = self.timed_as
        self.timed_as = parted(before, models)
        for key, m in [k for k in self.measured if k[0] in models]:
            heir = next((self.timed_as.get(x, x) for x, r in before.items() if r == key and x not in models), None)
            rate = self.measured.pop((key, m))
            if heir is not None:
                self.measured[(heir, m)] = rate

    def propose(self, rates: RateTable) -> RateTable:
        """`rates` with the measurements folded in (models without any are unchanged)."""
        profiles = []
        for profile in rates.models:
            timed = self.timed_as.get(profile.id, profile.id)
            seen = {m: r for (model, m), r in self.measured.items() if model == timed}
            profiles.append(self._refine(profile, seen, rates.gpus_per_node) if seen else profile)
        return RateTable(tuple(profiles), rates.gpus_per_node, rates.samples_per_epoch, rates.extra)

    @staticmethod
    def _refine(profile: ModelProfile, seen: dict[int, float], gpn: int) -> ModelProfile:
        logs = [math.log(r / profile.rate(m, gpn)) for m, r in seen.items()]
        factor = math.exp(sum(logs) / len(logs))
        top = max(len(profile.rates), max(seen))
        new = tuple(seen.get(m, profile.rate(m, gpn) * factor) for m in range(1, top + 1))
        return ModelProfile(profile.id, new, profile.epochs, profile.param_bytes, profile.extra)


def rate_changes(old: RateTable, new: RateTable, min_change: float = MIN_CHANGE) -> tuple[RateChange, ...]:
    """Entries of `new` that differ from `old` by at least `min_change` (relative)."""
    out = []
    for before, after in zip(old.models, new.models):
        for m in range(1, len(after.rates) + 1):
            a, b = before.rate(m, old.gpus_per_node), after.rates[m - 1]
            if abs(b / a - 1.0) >= min_change:
                out.append(RateChange(before.id, m, a, b))
    return tuple(out)


def weigh_refinement(
    current: RateTable,
    proposal: RateTable,
    remaining_epochs: Sequence[float],
    simulate_makespan: Callable[[RateTable, RateTable, Sequence[float]], float],
    change_cost_s: float,
    min_change: float = MIN_CHANGE,
) -> Refinement | None:
    """None when nothing moved by `min_change`; else the verdict.

    Args:
        current, proposal: tables over the models still to train, in the same order.
        remaining_epochs: per model, epochs it still needs (estimates).
        simulate_makespan: ``(truth, shown_to_policy, epochs) -> seconds`` of the remaining work.
        change_cost_s: seconds one moved model costs (checkpoint plus restore).
    """
    changes = rate_changes(current, proposal, min_change)
    if not changes:
        return None
    keep = simulate_makespan(proposal, current, remaining_epochs)
    new = simulate_makespan(proposal, proposal, remaining_epochs)
    cost = change_cost_s * len({c.model for c in changes})
    return Refinement(changes, keep, new, cost, adopt=keep - new > cost)


def makespan_simulator(make_policy: Callable[[], object], total_gpus: int, overheads=None):
    """A `simulate_makespan` for `weigh_refinement`: a fresh policy from `make_policy` runs the
    remaining work in the simulator (epochs rounded up to whole epochs)."""
    costs = overheads or Overheads()

    def run(truth: RateTable, shown: RateTable, epochs: Sequence[float]) -> float:
        scenario = Scenario(truth, whole_epochs(epochs), tuple(float(e) for e in epochs),
                            Cluster(total_gpus, truth.gpus_per_node), planning_rates=shown)
        return simulate(make_policy(), scenario, costs).makespan

    return run
