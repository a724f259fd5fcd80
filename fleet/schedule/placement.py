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

import bisect
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

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
    placed = set(order)
    rest = [i for i in range(len(gpu_counts)) if i not in placed]
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
    taken = set(order)
    rest = sorted((i for i in range(len(counts)) if i not in taken), key=lambda i: -counts[i])
    partners = _PartnerIndex([counts[i] for i in rest], gpn)
    for a, i in enumerate(rest):
        if a in partners.paired:
            continue
        b = partners.first_after(a, full_slots - used - counts[i])
        if b is not None:
            order += [i, rest[b]]
            used += counts[i] + counts[rest[b]]
    return order


class _PartnerIndex:
    """Members in descending count order, bucketed by ``count % gpn``, for step 2's pairing.

    ``first_after(a, room)`` is the first unpaired position after ``a`` whose count completes
    ``a``'s to a multiple of ``gpn`` and is at most ``room``: counts fall along the order, so
    within a bucket the members that fit form a suffix, found by bisection.
    """

    def __init__(self, counts: list[int], gpn: int):
        self.counts = counts
        self.gpn = gpn
        self.paired: set[int] = set()
        self.buckets: dict[int, list[int]] = {}
        for position, m in enumerate(counts):
            self.buckets.setdefault(m % gpn, []).append(position)

    def first_after(self, a: int, room: int) -> int | None:
        """Pair ``a`` with that position and return it; ``None`` when there is none."""
        bucket = self.buckets.get(-self.counts[a] % self.gpn, [])
        lo = bisect.bisect_right(bucket, a)
        k = bisect.bisect_left(bucket, -room, lo=lo, key=lambda p: -self.counts[p])
        if k == len(bucket):
            return None
        b = bucket.pop(k)
        self.paired |= {a, b}
        return b


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
    The depth-first search keeps its path on an explicit stack: a flotilla may have thousands
    of members, one level each.
    """
    if not members:
        return []
    best = _CountOrderSearch([g // gpn for g in slots], Counter(counts[i] for i in members), gpn).run(start, cap)
    pools: dict[int, list[int]] = {}
    for i in reversed(members):
        pools.setdefault(counts[i], []).append(i)
    return [pools[m].pop() for m in best]


class _CountOrderSearch:
    """Branch and bound over orders of a multiset of GPU counts laid out from one offset."""

    def __init__(self, node_of: list[int], remaining: Counter, gpn: int):
        self.node_of = node_of
        self.remaining = remaining
        self.gpn = gpn
        self.best_cost = math.inf
        self.best_order: list[int] | None = None

    def run(self, start: int, cap: int) -> list[int]:
        """The best order found within ``cap`` visited partial orders."""
        prefix: list[int] = []
        visits = 1  # the empty order
        stack = [_Frame(start, 0.0, self._choices(0.0))]
        while stack:
            frame = stack[-1]
            if frame.next == len(frame.choices):
                stack.pop()
                if prefix:
                    self.remaining[prefix.pop()] += 1
                continue
            m = frame.choices[frame.next]
            frame.next += 1
            if visits >= cap and self.best_order is not None:
                break
            visits += 1
            self.remaining[m] -= 1
            prefix.append(m)
            cost = frame.cost + self._run_cost(frame.offset, m)
            if not +self.remaining:
                self._offer(cost, prefix)
            choices = self._choices(cost)
            if choices:
                stack.append(_Frame(frame.offset + m, cost, choices))
            else:
                self.remaining[prefix.pop()] += 1
        return self.best_order

    def _choices(self, cost: float) -> list[int]:
        """Counts to try next, largest first; none at a leaf or where the bound prunes."""
        if not +self.remaining or cost + self._bound() >= self.best_cost - 1e-12:
            return []
        return sorted((m for m, c in self.remaining.items() if c > 0), reverse=True)

    def _offer(self, cost: float, order: list[int]) -> None:
        if cost < self.best_cost - 1e-12:
            self.best_cost, self.best_order = cost, list(order)

    def _run_cost(self, offset: int, m: int) -> float:
        return len(set(self.node_of[offset : offset + m])) / m

    def _bound(self) -> float:
        return sum(c * math.ceil(m / self.gpn) / m for m, c in self.remaining.items())


@dataclass(slots=True)
class _Frame:
    """One level of the depth-first search: where its run starts, its cost, what it tries."""

    offset: int
    cost: float
    choices: list[int]
    next: int = 0


def _lay_out(order: list[int], counts: Sequence[int], slots: list[int]) -> tuple[tuple[int, ...], ...]:
    runs: list[tuple[int, ...]] = [()] * len(counts)
    offset = 0
    for i in order:
        runs[i] = tuple(slots[offset : offset + counts[i]])
        offset += counts[i]
    return tuple(runs)
