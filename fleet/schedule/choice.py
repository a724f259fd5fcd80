"""``policy: auto``: the policy predicted to finish this ensemble first on this allocation (pure).

Each candidate runs the same scenario in the simulator (the rates, the epochs estimates, the
GPUs, decoding as measured) with its default options; the one with the lowest predicted
makespan is chosen, ties going to the candidate listed first. A small ensemble on a few GPUs
may finish first under `baseline` (no stream to pace, no regrouping); a large one under a FLEET
policy: which, the prediction says, not a rule of thumb.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from fleet.schedule._base import Policy
from fleet.schedule.costs import Overheads
from fleet.schedule.simulator import Scenario, simulate

AUTO = "auto"
CANDIDATES = ("fleet-g", "fleet-adaptive", "fleet-l", "homogeneous", "baseline")
"""What ``auto`` chooses from, in order of preference on a tie."""

PREDICTION_COSTS = Overheads(latency_s=0.5)
"""The checkpoint and restore costs predictions assume: 0.5 s + 3 x parameter bytes at 1 GB/s."""


@dataclass(frozen=True)
class PolicyChoice:
    name: str
    predicted_s: dict[str, float]  # each candidate's predicted makespan, seconds

    def describe(self) -> str:
        """``fleet-g (predicted 13.0 s; fleet-adaptive 13.4 s, baseline 9.9 s, ...)``."""
        others = ", ".join(f"{n} {s:,.1f} s" for n, s in self.predicted_s.items() if n != self.name)
        return f"{self.name} (predicted {self.predicted_s[self.name]:,.1f} s; {others})"


def choose_policy(make_policy: Callable[[str], Policy], scenario: Scenario, overheads: Overheads = PREDICTION_COSTS,
                  candidates: Sequence[str] = CANDIDATES) -> PolicyChoice:
    """The candidate with the lowest predicted makespan on `scenario`; `make_policy(name)` gives
    a fresh policy object of each."""
    return pick({name: simulate(make_policy(name), scenario, overheads).makespan for name in candidates}, candidates)


def pick(predicted: dict[str, float], candidates: Sequence[str] = CANDIDATES) -> PolicyChoice:
    """The choice among `candidates` given each one's predicted makespan (`predicted` may hold more)."""
    best = min(candidates, key=lambda name: predicted[name])  # min keeps the first of equals
    return PolicyChoice(best, {name: predicted[name] for name in candidates})
