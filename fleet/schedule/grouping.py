"""Where each group's data lives when every group trains its own models (pure; issue 47).

Learning over groups (Kingpin's GROUP BY for ML) trains one model per (group, configuration).
A group's training work is what all its configurations cost together: for group ``g`` and
configuration ``c``, ``n_g * E_c / r_c`` GPU-seconds (``n_g`` samples, ``E_c`` epochs at
``r_c`` samples/s on one GPU). A node of ``G`` GPUs does ``G`` GPU-seconds of it per second.

- `wrap_around` is McNaughton's rule: fill the machines one after another up to the optimal
  length ``C* = max(sum / p, max w)``, splitting the job that crosses each boundary; every
  job lands on at most two consecutive machines and no machine ends after ``C*``.
- `place_groups` is its constrained variant: a group whose work fits within one node's share
  stays whole on one node (its configurations share its decoded stream, no data is copied),
  placed largest first on the least loaded node; only a group larger than a node's share is
  sharded, wrapped around consecutive nodes, each shard sized by the share of the group's
  work it holds (its configurations then visit the shards in turn, as models hop over
  partitions). `shard_counts` rounds its shares to whole samples: how ``fleet data partition
  --group-by`` places the groups' samples onto parts.
- `group_bound` is the lower bound a grouped plan is measured against: the total work over
  all GPUs, or the longest single (group, configuration) at its best GPU count.

The planners learn each model's group from its rate table: `with_groups` writes it, with the
model's epoch scale (``N / n_g``, by which its rates are epoch-equivalent), into each model's
``extra`` (the runtime's plan and the simulator's scenarios both build their tables with it);
`group_of` and `epoch_scale_of` read them, `check_one_group` holds every launch to one group
per stream, and `zipf_sizes` splits samples over groups for simulated workloads.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from fleet.schedule._base import PolicyError, StreamPlan
from fleet.schedule.rates import ModelProfile, RateTable

_EPS = 1e-12
GROUP_KEY = "group"
"""The key of a model's group in its profile's ``extra`` (a rate table the planners see)."""
SCALE_KEY = "epoch_scale"
"""The key of a grouped model's epoch scale (``N / n_g``) in its profile's ``extra``."""


@dataclass(frozen=True)
class Shard:
    """A part of a group's samples held on one node.

    Attributes:
        node: the node that holds it.
        fraction: its share of the group's samples (a group's shards sum to 1).
    """

    node: int
    fraction: float


@dataclass(frozen=True)
class GroupPlacement:
    """Every group's shards and every node's load.

    Attributes:
        shards: per group (in the order given), its shards; one shard of fraction 1 for a
            group kept whole.
        loads: per node, the GPU-seconds of work it holds.
        share: the GPU-seconds of work a node was filled to (its share of the optimum).
    """

    shards: tuple[tuple[Shard, ...], ...]
    loads: tuple[float, ...]
    share: float

    def sharded(self) -> list[int]:
        """The groups split over more than one node."""
        return [g for g, parts in enumerate(self.shards) if len(parts) > 1]

    def makespan(self, gpus_per_node: int) -> float:
        """Seconds the most loaded node needs with its GPUs all busy."""
        return max(self.loads, default=0.0) / gpus_per_node


def wrap_around(works: Sequence[float], machines: int, length: float | None = None) -> list[list[tuple[int, float]]]:
    """McNaughton's wrap-around: per machine, the ``(job, amount)`` pieces it processes, each
    machine filled to `length` (default the optimum ``C*``) before the next; whatever does not
    fit `machines` machines of `length` stays on the last.

    Raises:
        ValueError: no machine, a negative work or a length that is not positive.
    """
    if machines < 1:
        raise ValueError("wrap_around needs at least one machine")
    if any(w < 0 for w in works):
        raise ValueError("works must not be negative")
    if length is None:
        length = max(sum(works) / machines, max(works, default=0.0))
    if not length > 0:
        if sum(works) > 0:
            raise ValueError("wrap_around needs a positive length")
        return [[] for _ in range(machines)]
    bins: list[list[tuple[int, float]]] = [[] for _ in range(machines)]
    machine, filled = 0, 0.0
    for job, work in enumerate(works):
        left = work
        while left > _EPS * max(1.0, work):
            take = min(left, length - filled)
            bins[min(machine, machines - 1)].append((job, take))
            filled, left = filled + take, left - take
            if filled >= length * (1 - 1e-12):
                machine, filled = machine + 1, 0.0
    return bins


def place_groups(works: Sequence[float], nodes: int, gpus_per_node: int) -> GroupPlacement:
    """The constrained wrap-around: small groups whole, large ones sharded (see the module).

    Args:
        works: each group's training work in GPU-seconds (all its configurations).
        nodes: nodes of the job.
        gpus_per_node: GPUs of each node.

    Raises:
        ValueError: no node or GPU, or a negative work.
    """
    if nodes < 1 or gpus_per_node < 1:
        raise ValueError("place_groups needs at least one node and one GPU per node")
    if any(w < 0 for w in works):
        raise ValueError("works must not be negative")
    share = sum(works) / nodes
    large = [g for g in range(len(works)) if works[g] > share * (1 + 1e-9)]
    shards: dict[int, tuple[Shard, ...]] = {}
    loads = [0.0] * nodes
    pieces = wrap_around([works[g] for g in large], nodes, share) if large else []
    by_group: dict[int, list[Shard]] = {}
    for node, parts in enumerate(pieces):
        for index, amount in parts:
            group = large[index]
            by_group.setdefault(group, []).append(Shard(node, amount / works[group]))
            loads[node] += amount
    shards.update({g: tuple(parts) for g, parts in by_group.items()})
    small = sorted((g for g in range(len(works)) if g not in shards), key=lambda g: (-works[g], g))
    for group in small:
        node = min(range(nodes), key=lambda k: (loads[k], k))
        shards[group] = (Shard(node, 1.0),)
        loads[node] += works[group]
    return GroupPlacement(tuple(shards[g] for g in range(len(works))), tuple(loads), share)


def shard_counts(sizes: Sequence[int], parts: int) -> list[list[tuple[int, int]]]:
    """Each group's ``(part, samples)`` shards (groups in the order of `sizes`, their sample
    counts): `place_groups` of the samples onto `parts` parts (``fleet data partition
    --group-by``), each sharded group's fractions rounded to whole samples by largest
    remainder (an empty shard is dropped)."""
    placement = place_groups([float(size) for size in sizes], parts, 1)
    out = []
    for size, shards in zip(sizes, placement.shards):
        exact = np.array([shard.fraction * size for shard in shards])
        counts = np.floor(exact).astype(np.int64)
        for k in np.argsort(-(exact - counts), kind="stable")[: size - int(counts.sum())]:
            counts[k] += 1
        out.append([(shard.node, int(n)) for shard, n in zip(shards, counts) if n > 0])
    return out


def group_bound(works: Sequence[float], gpus: int, longest_s: float) -> float:
    """Seconds no grouped plan can beat: the total work over all `gpus`, or `longest_s`, the
    longest single (group, configuration) at its best GPU count."""
    if gpus < 1:
        raise ValueError("group_bound needs at least one GPU")
    return max(sum(works) / gpus, longest_s)


def with_groups(table: RateTable, scales: Mapping[str, float], groups: Mapping[str, str] | None = None) -> RateTable:
    """`table` with each model's rates times its epoch scale (`scales`, 1 for a model not in
    it) and, for a model in `groups`, its group and scale in its profile's ``extra``: a model
    of a group trains an epoch of its group's n_g samples, the planners count every epoch as
    ``samples_per_epoch`` (N), so its rates times N / n_g make an epoch last n_g / r.
    `table` itself where neither is given."""
    groups = groups or {}
    if not scales and not groups:
        return table
    models = tuple(_grouped_profile(p, scales.get(p.id, 1.0), groups.get(p.id)) for p in table.models)
    return RateTable(models, table.gpus_per_node, table.samples_per_epoch, table.extra)


def _grouped_profile(profile: ModelProfile, scale: float, group: str | None) -> ModelProfile:
    extra = dict(profile.extra)
    if group is not None:
        extra.update({GROUP_KEY: group, SCALE_KEY: float(scale)})
    return ModelProfile(profile.id, tuple(r * scale for r in profile.rates), profile.epochs, profile.param_bytes,
                        extra)


def group_of(table: RateTable, model_id: str) -> str | None:
    """The group `model_id` trains on (None: the whole data)."""
    return table.profile(model_id).extra.get(GROUP_KEY)


def epoch_scale_of(profile: ModelProfile) -> float:
    """A model's epoch scale N / n_g (1 for a model of the whole data): its epoch-equivalent
    samples per real sample decoded."""
    return float(profile.extra.get(SCALE_KEY, 1.0))


def check_one_group(plans: Iterable[StreamPlan], policy: str, table: RateTable,
                    stream_members: Mapping[int, Iterable[str]]) -> None:
    """Every stream launched, or joined (`stream_members`: each running stream's models),
    holds models of one group only.

    Raises:
        PolicyError: a stream would mix groups.
    """
    for plan in plans:
        models = [m.model for m in plan.members] + list(stream_members.get(plan.join, ()) if plan.join is not None else ())
        groups = {group_of(table, model) for model in models}
        if len(groups) > 1:
            raise PolicyError(f"{policy}: a stream of {', '.join(models)} mixes groups "
                              f"({', '.join(sorted(map(str, groups)))})")


def zipf_sizes(total: int, groups: int, exponent: float, minimum: int = 1) -> list[int]:
    """`total` samples over `groups` groups, group ``k`` (from 0) about ``1 / (k + 1) ** exponent``
    of the others, each at least `minimum`; they sum to `total`, largest first.

    Raises:
        ValueError: fewer than one group, a negative exponent, or too few samples for the minimum.
    """
    if groups < 1:
        raise ValueError(f"expected at least 1 group, got {groups}")
    if exponent < 0:
        raise ValueError(f"expected a skew (Zipf exponent) >= 0, got {exponent}")
    if total < groups * minimum:
        raise ValueError(f"{total} samples cannot give {groups} groups {minimum} sample(s) each")
    weights = 1.0 / np.arange(1, groups + 1) ** exponent
    spare = total - groups * minimum
    shares = spare * weights / weights.sum()
    sizes = np.floor(shares).astype(int)
    for k in np.argsort(-(shares - sizes), kind="stable")[: spare - int(sizes.sum())]:
        sizes[k] += 1  # the largest remainders take what flooring left
    return [int(s) + minimum for s in sizes]
