"""Group-task parallelism (GTP, a baseline of issue 47): whole groups on one node each, the
largest first, each group's configurations side by side on its node's GPUs.

Whenever GPUs come free on a node, waiting configurations of a group training there join its
stream (a GPU each); then the node starts the groups with the most work among those not yet
started, each on one stream of its own: a GPU per configuration, or, for the last group there
is, every free GPU of the node rate-matched over its configurations. A group never trains on
two nodes, so a run lasts at least as long as its largest group on one node.
"""

from __future__ import annotations

from fleet.schedule._base import ClusterView, Decision
from fleet.schedule.planners._groups import GroupPolicy, free_by_node, group_streams


class GroupTask(GroupPolicy):
    """Whole groups on one node each, the largest first (see the module)."""

    name = "group-task"

    def fill(self, view: ClusterView) -> Decision:
        free = free_by_node(view)
        running = group_streams(view)
        plans = []
        for node in sorted(free):
            gpus = free[node]
            plans += self.join_running(node, gpus, running, view)
            fresh = [g for g in self.largest_first() if g not in running]
            while gpus and fresh:
                group = fresh.pop(0)
                running[group] = (-1, {node})  # started: its waiting models wait for this node
                chosen = gpus if not fresh else gpus[:len(self.waiting[group])]
                plans.append(self.launch(group, chosen, view))
                if chosen is not gpus:
                    gpus[:] = gpus[len(plans[-1].members):]
        return Decision.launching(plans)
