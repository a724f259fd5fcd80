"""Model hopping over partitioned data: `mop` (Cerebro as published) and `fleet-hop`.

Both plan *visits* (see `fleet.schedule.partitions`): a model trains one pass over the
partition on its GPUs' nodes, hops, and has trained an epoch when it has visited every
partition once. The driver checks the invariants (each visit on one partition, none twice in
an epoch, a model on one partition at a time, no GPU shared, visits not cut short).

`mop` is Cerebro's randomized scheduler (Nakandala et al., PVLDB 2020): each idle GPU, in
order, takes a model drawn at random among the idle ones that have its partition still to
visit; a model trains on one GPU and decodes its own data. The seed makes the visit order
reproducible.

`fleet-hop` adds what fleet does to hopping. On each partition's nodes, the models that
visit it now share that node group's decoded stream in rate-matched flotillas, so a sample is
decoded once for all of them. The models with the most work left go first (longest remaining
processing time: the ones that would otherwise finish last), and when fewer models are left
than GPUs, a model visits on several GPUs of one node (data-parallel), as many as speed it up,
up to its share of the cluster.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fleet.schedule._base import ClusterView, Decision, Member, ModelState, Policy, StreamPlan
from fleet.schedule.flotilla import DEFAULT_RELATIVE_DELTA, useful_counts
from fleet.schedule.options import NoOptions, PolicyOptions, option
from fleet.schedule.placement import place


class _Hopper(Policy):
    """A hopping policy that fills free GPUs whenever some come free."""

    hops = True

    def start(self, view: ClusterView) -> Decision:
        return self.fill(view)

    def on_converged(self, event, view: ClusterView) -> Decision:
        return self.fill(view)

    def on_checkpointed(self, event, view: ClusterView) -> Decision:
        return self.fill(view)

    def fill(self, view: ClusterView) -> Decision:
        """Launch visits onto the free GPUs."""
        raise NotImplementedError


def free_by_partition(view: ClusterView) -> dict[int, list[int]]:
    """The free GPUs of each partition, ascending."""
    groups: dict[int, list[int]] = {}
    for g in view.free_gpus:
        groups.setdefault(view.partitions.of_gpu(g), []).append(g)
    return groups


class ModelHopper(_Hopper):
    """Cerebro's MOP: single-GPU visits, a random idle model for each idle GPU.

    Args:
        options: none (:class:`~fleet.schedule.options.NoOptions`).
        seed: seeds the draws (the visit order).
    """

    name = "mop"
    uses_refined_rates = False  # the draws never read a rate

    def __init__(self, options: NoOptions = NoOptions(), seed: int = 0):
        self.rng = np.random.default_rng(seed)

    def fill(self, view: ClusterView) -> Decision:
        idle = view.waiting()
        visited = {m.id: m.visited for m in view.models}
        plans = []
        for g in view.free_gpus:
            partition = view.partitions.of_gpu(g)
            able = [m for m in idle if partition not in visited[m]]
            if able:
                model = able[int(self.rng.integers(len(able)))]
                idle.remove(model)
                plans.append(StreamPlan((Member(model, (g,)),)))
        return Decision.launching(plans)


@dataclass(frozen=True)
class FleetHopOptions(PolicyOptions):
    """`fleet-hop`'s options.

    Attributes:
        delta: models whose rates differ by at most this fraction of the faster one share a
            stream; in (0, 1].
    """

    delta: float = option(DEFAULT_RELATIVE_DELTA, gt=0, le=1)


class FleetHop(_Hopper):
    """Model hopping with shared streams, longest work first and multi-GPU visits in the tail.

    Args:
        options: :class:`FleetHopOptions`.
        seed: unused (the policy is deterministic); accepted for a uniform constructor.
    """

    name = "fleet-hop"
    Options = FleetHopOptions
    # the runtime's weighing simulates the rest of the run once per report, which here is once per
    # hop; until the weighing knows partitions, fleet-hop plans on the profiled rates
    uses_refined_rates = False

    def __init__(self, options: FleetHopOptions = FleetHopOptions(), seed: int = 0):
        self.delta = options.delta

    def fill(self, view: ClusterView) -> Decision:
        work = {m: remaining_work(view, m) for m in view.waiting()}
        idle = sorted(work, key=lambda m: -work[m])
        left = len(view.models) - len(view.ids_in(ModelState.CONVERGED))
        share = max(1, view.total_gpus // max(1, left))  # GPUs a model may take: its share of the cluster
        plans: list[StreamPlan] = []
        visited = {m.id: m.visited for m in view.models}
        for partition, free in sorted(free_by_partition(view).items()):
            able = [m for m in idle if partition not in visited[m]]
            counts = visit_gpus(view, able, work, len(free), min(share, view.gpus_per_node))
            if not counts:
                continue
            for m in counts:
                idle.remove(m)
            plans.extend(rate_matched_streams(view, counts, free, self.delta))
        return Decision.launching(plans)


def remaining_work(view: ClusterView, model_id: str) -> float:
    """Seconds a model still needs on one GPU: its estimated epochs left, less the partitions
    it visited in its current epoch (at least the rest of this epoch)."""
    model = view.model(model_id)
    partitions = view.partitions
    seen = partitions.share(model.visited)
    left = max(model.epochs_estimate - model.epochs_done - seen, 1.0 - seen)
    return left * partitions.samples / view.rates.rate(model_id, 1)


def visit_gpus(view: ClusterView, able: Sequence[str], work: dict[str, float], free: int,
               most: int) -> dict[str, int]:
    """GPUs for the next visits on one partition's `free` GPUs: one each to the first models of
    `able` (most `work` first), then, while GPUs are left, the next useful count (one that
    beats every smaller count) to the model that would take longest, up to `most` GPUs each."""
    counts = {m: 1 for m in able[:free]}
    spare = free - len(counts)
    if not counts or spare <= 0 or most <= 1:
        return counts
    table = view.rates.matrix(most)
    useful = useful_counts(table)
    rows = {m: view.rates.index(m) for m in counts}
    while spare > 0:
        best = None
        for m, c in counts.items():
            higher = np.flatnonzero(useful[rows[m], c:min(most, c + spare)])
            if higher.size:
                time_now = work[m] * table[rows[m], 0] / table[rows[m], c - 1]
                if best is None or time_now > best[0]:
                    best = (time_now, m, c + 1 + int(higher[0]))
        if best is None:
            return counts
        _, m, c = best
        spare -= c - counts[m]
        counts[m] = c
    return counts


def rate_matched_streams(view: ClusterView, counts: dict[str, int], free: Sequence[int],
                         delta: float) -> list[StreamPlan]:
    """The visits of one partition as streams: members sorted by rate, a new stream wherever a
    member is more than `delta` slower than its stream's fastest; placed node-local first."""
    order = sorted(counts, key=lambda m: -view.rates.rate(m, counts[m]))
    groups: list[list[str]] = []
    for m in order:
        if groups and view.rates.rate(m, counts[m]) >= (1 - delta) * view.rates.rate(groups[-1][0], counts[groups[-1][0]]):
            groups[-1].append(m)
        else:
            groups.append([m])
    flat = [m for group in groups for m in group]
    runs = dict(zip(flat, place([counts[m] for m in flat], free, view.gpus_per_node)))
    return [StreamPlan(tuple(Member(m, runs[m]) for m in group)) for group in groups]
