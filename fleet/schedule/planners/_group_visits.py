"""Grouped learning on data partitioned by its groups (issue 47): visits of each group's parts.

``fleet data partition --group-by`` keeps a small group whole on one part and shards a large
one over consecutive parts (`fleet.schedule.partitions`). Every model then trains by visits:
one pass over its group's shard on one part, then a hop through its checkpoint. A model of a
whole group visits its one part each epoch; a model of a sharded group visits each of its
parts once an epoch (Kingpin's GAP: each configuration in one place at a time, its data never
moved, the group's configurations spread over its parts).

Whenever GPUs come free, each part's free GPUs go to the groups with models that may visit it,
the most work first: each such group launches one stream there of those models, a GPU each
(the group's shard decoded once for all of them), while the part has free GPUs.
"""

from __future__ import annotations

from collections.abc import Mapping

from fleet.schedule._base import ClusterView, StreamPlan
from fleet.schedule.planners._groups import group_stream
from fleet.schedule.planners.hopping import free_by_partition


def group_visits(view: ClusterView, waiting: Mapping[str | None, list[str]],
                 work: Mapping[str | None, float]) -> list[StreamPlan]:
    """The visits to launch on the free GPUs of `view` (see the module): per part, a stream of
    each group's `waiting` models that still visit it this epoch, the groups of most `work`
    first, one GPU per model."""
    order = sorted(waiting, key=lambda g: (-work.get(g, 0.0), str(g)))
    launched: set[str] = set()
    plans = []
    for partition, free in sorted(free_by_partition(view).items()):
        for group in order:
            able = [m for m in waiting[group] if m not in launched and partition in view.to_visit(m)]
            if not free:
                break
            if not able:
                continue
            plan = group_stream(view.rates, able[:len(free)], free[:len(able)])
            used = {g for member in plan.members for g in member.gpus}
            free = [g for g in free if g not in used]
            launched.update(member.model for member in plan.members)
            plans.append(plan)
    return plans
