"""FLEET's GPU placement (Alg. 3 and Alg. 4): contiguous GPU runs, node-local first.

Given the GPU count of each member of a flotilla and the free GPUs, give each member a run of
GPUs that are consecutive in the placement order, keeping groups inside as few nodes as
possible (GPU ``g`` is on node ``g // gpn``):

1. Members whose count is a multiple of ``gpn`` take whole free nodes.
2. Pairs of members whose counts add up to a multiple of ``gpn`` share whole free nodes
   back to back, so neither run spills onto an extra node.
3. The rest are laid out one after another in the order found by a capped permutation
   search (Alg. 4) minimising ``sum_i nodes(a_i) / m_i``.

The placement order lists the GPUs of fully free nodes first, then those of partly free
nodes, each in ascending index order. On an empty cluster this is simply ``0, 1, 2, ...``.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

DEFAULT_SEARCH_CAP = 20_000
"""Partial orders Alg. 4 may visit before it keeps the best order found so far."""


def node_count(gpus: Sequence[int], gpus_per_node: int) -> int:
    """Number of distinct nodes that a set of GPUs touches."""
    return len({g // gpus_per_node for g in gpus})


def place(
    gpu_counts: Sequence[int],
    free_gpus: Sequence[int],
    gpus_per_node: int,
    search_cap: int = DEFAULT_SEARCH_CAP,
) -> tuple[tuple[int, ...], ...]:
    """Alg. 3/4: assign each member a run of free GPUs.

    Args:
        gpu_counts: ``m_i`` of each member, each ``>= 1``.
        free_gpus: global indices of the GPUs that may be used.
        gpus_per_node: GPUs per node (``gpn``).
        search_cap: budget of Alg. 4's permutation search.

    Returns:
        One tuple of global GPU indices per member, in the order of ``gpu_counts``.

    Raises:
        ValueError: when the members need more GPUs than are free, or a count is < 1.
    """
    if any(m < 1 for m in gpu_counts):
        raise ValueError(f"every member needs at least one GPU, got {list(gpu_counts)}")
    slots = _placement_order(free_gpus, gpus_per_node)
    if sum(gpu_counts) > len(slots):
        raise ValueError(f"members need {sum(gpu_counts)} GPUs, only {len(slots)} are free")
    full_node_slots = _full_node_slot_count(free_gpus, gpus_per_node)
    order = _node_local_first(gpu_counts, gpus_per_node, full_node_slots)
    rest = [i for i in range(len(gpu_counts)) if i not in set(order)]
    start = sum(gpu_counts[i] for i in order)
    order += _search_order(rest, gpu_counts, slots, start, gpus_per_node, search_cap)
    return _lay_out(order, gpu_counts, slots)


def _placement_order(free_gpus: Sequence[int], gpus_per_node: int) -> list[int]:
    """Free GPUs, those of fully free nodes first, each group in ascending order."""
    per_node = Counter(g // gpus_per_node for g in free_gpus)
    full = sorted(g for g in set(free_gpus) if per_node[g // gpus_per_node] == gpus_per_node)
    partial = sorted(g for g in set(free_gpus) if per_node[g // gpus_per_node] < gpus_per_node)
    return full + partial


def _full_node_slot_count(free_gpus: Sequence[int], gpus_per_node: int) -> int:
    per_node = Counter(g // gpus_per_node for g in set(free_gpus))
    return gpus_per_node * sum(1 for c in per_node.values() if c == gpus_per_node)


def _node_local_first(counts: Sequence[int], gpn: int, full_slots: int) -> list[int]:
    """Steps 1 and 2 of Alg. 3: members (and pairs) that fill whole free nodes."""
    order: list[int] = []
    used = 0
    for i in sorted(range(len(counts)), key=lambda i: -counts[i]):
        if counts[i] % gpn == 0 and used + counts[i] <= full_slots:
            order.append(i)
            used += counts[i]
    rest = sorted((i for i in range(len(counts)) if i not in set(order)), key=lambda i: -counts[i])
    paired: set[int] = set()
    for a, i in enumerate(rest):
        if i in paired:
            continue
        for j in rest[a + 1 :]:
            pair = counts[i] + counts[j]
            if j not in paired and pair % gpn == 0 and used + pair <= full_slots:
                order += [i, j]
                paired |= {i, j}
                used += pair
                break
    return order


def _search_order(
    members: list[int],
    counts: Sequence[int],
    slots: list[int],
    start: int,
    gpn: int,
    cap: int,
) -> list[int]:
    """Alg. 4: order of the remaining members minimising ``sum nodes(a_i)/m_i``.

    Members with equal counts are interchangeable, so the search runs over the multiset of
    counts (depth-first, largest count first, pruned by a lower bound) and visits at most
    ``cap`` partial orders. The first complete order (largest count first) is the fallback.
    """
    if not members:
        return []
    node_of = [g // gpn for g in slots]
    remaining = Counter(counts[i] for i in members)
    best: dict = {"cost": math.inf, "order": None}
    visits = [0]

    def run_cost(offset: int, m: int) -> float:
        return len(set(node_of[offset : offset + m])) / m

    def bound(rem: Counter) -> float:
        return sum(c * math.ceil(m / gpn) / m for m, c in rem.items())

    def dfs(offset: int, cost: float, prefix: list[int]) -> None:
        if visits[0] >= cap and best["order"] is not None:
            return
        visits[0] += 1
        if not +remaining:
            if cost < best["cost"] - 1e-12:
                best["cost"], best["order"] = cost, list(prefix)
            return
        if cost + bound(remaining) >= best["cost"] - 1e-12:
            return
        for m in sorted((m for m, c in remaining.items() if c > 0), reverse=True):
            remaining[m] -= 1
            prefix.append(m)
            dfs(offset + m, cost + run_cost(offset, m), prefix)
            prefix.pop()
            remaining[m] += 1

    dfs(start, 0.0, [])
    pools: dict[int, list[int]] = {}
    for i in members:
        pools.setdefault(counts[i], []).append(i)
    return [pools[m].pop(0) for m in best["order"]]


def _lay_out(order: list[int], counts: Sequence[int], slots: list[int]) -> tuple[tuple[int, ...], ...]:
    runs: list[tuple[int, ...]] = [()] * len(counts)
    offset = 0
    for i in order:
        runs[i] = tuple(slots[offset : offset + counts[i]])
        offset += counts[i]
    return tuple(runs)
