"""Homogeneous: data sharing designed for identical models (Pittman et al., 2018).

Each round takes a random subset of the remaining models, one per GPU (up to ``M``), and
trains them on one shared stream, which moves at the pace of its slowest member. The next
round starts only when every member of the current one has converged.
"""

from __future__ import annotations

from fleet.schedule._base import NO_DECISION, ClusterView, Decision, Member, ModelConverged, StreamPlan
from fleet.schedule.planners._common import RandomOrder


class Homogeneous(RandomOrder):
    """Rounds of randomly chosen single-GPU models on one shared stream."""

    name = "homogeneous"

    def on_converged(self, event: ModelConverged, view: ClusterView) -> Decision:
        return self.on_free(view) if view.drained else NO_DECISION

    def on_free(self, view: ClusterView) -> Decision:
        models = self.take(view)
        if not models:
            return NO_DECISION
        return Decision.launching([StreamPlan(tuple(Member(m, (g,)) for m, g in zip(models, view.free_gpus)))])
