"""Grouped learning on data partitioned by its groups (issue 47): visits of each group's parts.

``fleet data partition --group-by`` keeps a small group whole on one part and shards a large
one over consecutive parts (`fleet.schedule.partitions`). Every model then trains by visits:
one pass over its group's shard on one part, then a hop through its checkpoint. A model of a
whole group visits its one part each epoch; a model of a sharded group visits each of its
parts once an epoch (Kingpin's GAP: each configuration in one place at a time, its data never
moved, the group's configurations spread over its parts).

Whenever GPUs come free, each part's free GPUs go to the groups with models that may visit it,
the most work first: each such group launches one stream there of those models, a GPU each
(the group's shard decoded once for all of them), while the part has free GPUs; GPUs left over
widen the streams of most work per GPU (rate-matched within each stream: `group_stream`).
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
    first, a GPU per model and the part's GPUs left over to the streams of most work per GPU
    (`spread`)."""
    order = sorted(waiting, key=lambda g: (-work.get(g, 0.0), str(g)))
    launched: set[str] = set()
    plans = []
    for partition, free in sorted(free_by_partition(view).items()):
        picks: dict[str | None, list[str]] = {}
        for group in order:
            room = len(free) - sum(map(len, picks.values()))
            able = [m for m in waiting[group] if m not in launched and partition in view.to_visit(m)][:room]
            if able:
                picks[group] = able
                launched.update(able)
        counts = spread({g: len(models) for g, models in picks.items()}, len(free), work, view.gpus_per_node)
        for group, models in picks.items():
            plans.append(group_stream(view.rates, models, free[:counts[group]]))
            free = free[counts[group]:]
    return plans


def spread(counts: dict, gpus: int, work: Mapping[str | None, float], most_each: int) -> dict:
    """`counts` (GPUs per group's stream: one per model) with the `gpus` left over handed out
    one at a time to the stream of most `work` per GPU, each model up to `most_each` GPUs
    (one node's: a visit stays on its part's nodes, data-parallel within a node)."""
    counts = dict(counts)
    models = dict(counts)
    for _ in range(gpus - sum(counts.values())):
        able = [g for g in counts if counts[g] < models[g] * most_each]
        if not able:
            break
        best = max(able, key=lambda g: work.get(g, 0.0) / counts[g])
        counts[best] += 1
    return counts
