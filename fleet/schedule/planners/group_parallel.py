"""Data parallelism over groups (DP, a baseline of issue 47): the groups one after another,
the most work first, each group's configurations in turn, each trained data-parallel over the
GPUs of the whole job (up to its fastest GPU count: beyond it a model only slows down).

One model trains at a time, on a stream of its own; the next starts when it has converged.
"""

from __future__ import annotations

from fleet.schedule._base import NO_DECISION, ClusterView, Decision, Member, StreamPlan
from fleet.schedule.placement import place
from fleet.schedule.planners._groups import GroupPolicy


class GroupParallel(GroupPolicy):
    """Each (group, configuration) in turn over all GPUs (see the module)."""

    name = "group-parallel"
    plans_only_when_drained = True

    def fill(self, view: ClusterView) -> Decision:
        if view.streams or not view.drained:
            return NO_DECISION
        groups = self.largest_first()
        if not groups:
            return NO_DECISION
        model = self.waiting[groups[0]].pop(0)
        profile, gpn = view.rates.profile(model), view.gpus_per_node
        count = max(range(1, view.total_gpus + 1), key=lambda m: (profile.rate(m, gpn), -m))
        run = place([count], view.free_gpus, gpn)[0]
        return Decision.launching([StreamPlan((Member(model, run),))])
