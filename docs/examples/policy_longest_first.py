"""Example: a new policy, "longest-first" (one model per GPU, the longest estimated first).

Three things make a policy (see docs/architecture.md, "Adding a policy"):
1. a `Policy` subclass answering `start` and the events it cares about with a `Decision`
   (the protocol is written in `fleet/schedule/_base.py`; the driver checks every decision);
2. its options, a frozen dataclass of `option(...)` fields (`fleet/schedule/options.py`);
3. one entry in `fleet.schedule.planners.POLICIES` under its name; the spec's
   `scheduler.policy` and its options then accept it, and `fleet simulate` runs it.
"""

from __future__ import annotations

from dataclasses import dataclass

from fleet.schedule import NO_DECISION, ClusterView, Decision, Member, Policy, StreamPlan
from fleet.schedule.options import PolicyOptions, option


@dataclass(frozen=True)
class LongestFirstOptions(PolicyOptions):
    """Attributes:
        gpus_per_model: GPUs each model trains on (data-parallel), 1 or more.
    """

    gpus_per_model: int = option(1, integer=True, ge=1)


class LongestFirst(Policy):
    """Whenever GPUs are free, the waiting model with the most estimated work left takes them,
    alone on a stream of its own (LPT list scheduling without shared data)."""

    name = "longest-first"
    Options = LongestFirstOptions
    uses_refined_rates = False  # the order uses estimates of epochs only

    def __init__(self, options: LongestFirstOptions = LongestFirstOptions(), seed: int = 0):
        self.gpus = options.gpus_per_model

    def start(self, view: ClusterView) -> Decision:
        return self._fill(view)

    def on_converged(self, event, view: ClusterView) -> Decision:
        return self._fill(view)

    def on_checkpointed(self, event, view: ClusterView) -> Decision:
        return self._fill(view)

    def _fill(self, view: ClusterView) -> Decision:
        waiting = sorted(view.waiting(), key=lambda m: self._work(view, m), reverse=True)
        free, streams = list(view.free_gpus), []
        for model in waiting:
            if len(free) < self.gpus:
                break
            gpus, free = tuple(free[: self.gpus]), free[self.gpus:]
            streams.append(StreamPlan((Member(model, gpus),)))
        return Decision.launching(streams) if streams else NO_DECISION

    def _work(self, view: ClusterView, model: str) -> float:
        state = view.model(model)
        return max(state.epochs_estimate - state.epochs_done, 1.0) / view.rates.rate(model, self.gpus)
