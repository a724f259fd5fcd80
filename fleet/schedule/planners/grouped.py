"""Grouped learning (issue 47, Kingpin's GROUP BY for ML): each group's configurations train
together on one stream of its decoded samples, on the nodes the group's work is placed on.

At the start the groups' training work (n_g x E_c / r_c over the group's configurations,
`model_work`) is placed on the nodes by the constrained wrap-around
(`fleet.schedule.grouping.place_groups`): a group within one node's share of the work is kept
whole on one node, in that node's queue (the most work first); a larger one is *spread*: it
starts at once as one stream over as many GPUs as its share of the work, on the nodes the
wrap-around gave it, its configurations with rate-matched GPU counts (multi-GPU members; a
later step shards its data instead, each configuration hopping from shard to shard).

Whenever GPUs come free on a node, in this order:
1. waiting configurations of a group whose stream trains on that node join that stream, and
   those of a group whose stream ended before they could join start a stream of their own;
2. the node's next queued groups start, each on one stream: a GPU per configuration, or, for
   the node's last group, every free GPU rate-matched over its configurations;
3. with its queue empty, the node takes the next group of the node with the most queued work;
4. then any group's waiting configurations, on a stream of their own (decoded again).

Each stream holds one group's models only; a group kept whole decodes its samples once per
epoch pass for all its configurations.
"""

from __future__ import annotations

import math

from fleet.schedule._base import ClusterView, Decision, StreamPlan
from fleet.schedule.grouping import place_groups
from fleet.schedule.planners._groups import GroupPolicy, free_by_node, group_streams


class Grouped(GroupPolicy):
    """Groups placed on nodes by work, each whole group one stream (see the module)."""

    name = "grouped"

    def plan(self, view: ClusterView) -> None:
        groups = self.largest_first()
        nodes = math.ceil(view.total_gpus / view.gpus_per_node)
        placement = place_groups([self.work[g] for g in groups], nodes, view.gpus_per_node)
        self.queues: dict[int, list[str | None]] = {k: [] for k in range(nodes)}
        self.spread: list[tuple[str | None, list[int], int]] = []  # (group, nodes, GPUs)
        for group, shards in zip(groups, placement.shards):
            if len(shards) == 1:
                self.queues[shards[0].node].append(group)
            else:
                gpus = round(self.work[group] / max(placement.share, 1e-12) * view.gpus_per_node)
                self.spread.append((group, [s.node for s in shards], min(max(gpus, 1), view.total_gpus)))

    def fill(self, view: ClusterView) -> Decision:
        free = free_by_node(view)
        plans = self._spread(free, view)
        running = group_streams(view)
        for node in sorted(free):
            gpus = free[node]
            plans += self.join_running(node, gpus, running, view)
            plans += self.resume_started(gpus, running, view)
            plans += self._queued(node, gpus, view)
            plans += self._stolen(node, gpus, view)
            plans += [self.launch(g, gpus, view) for g in self.largest_first() if gpus]
        return Decision.launching(plans)

    def _spread(self, free: dict[int, list[int]], view: ClusterView) -> list[StreamPlan]:
        """The groups larger than a node's share, each one stream over its nodes' free GPUs."""
        plans = []
        for group, nodes, count in self.spread:
            gpus = [g for k in nodes for g in free.get(k, [])][:count]
            if gpus and self.waiting.get(group):
                plans.append(self.launch(group, gpus, view))
                used = {g for member in plans[-1].members for g in member.gpus}
                for k in nodes:
                    free[k] = [g for g in free.get(k, []) if g not in used]
        self.spread = []
        return plans

    def _queued(self, node: int, gpus: list[int], view: ClusterView) -> list[StreamPlan]:
        """The node's queued groups, while it has free GPUs."""
        plans, queue = [], self.queues[node]
        while gpus and queue:
            group = queue.pop(0)
            if self.waiting.get(group):
                last = not queue
                plans.append(self.launch(group, gpus if last else gpus[:len(self.waiting[group])], view))
                if not last:
                    gpus[:] = gpus[len(plans[-1].members):]
        return plans

    def _stolen(self, node: int, gpus: list[int], view: ClusterView) -> list[StreamPlan]:
        """Groups taken from the queue with the most work, while the node has free GPUs."""
        plans = []
        while gpus:
            loaded = [k for k, queue in self.queues.items() if queue]
            if not loaded:
                break
            victim = max(loaded, key=lambda k: (sum(self.work[g] for g in self.queues[k]), -k))
            self.queues[node].append(self.queues[victim].pop(0))
            plans += self._queued(node, gpus, view)
        return plans
