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
processing time: the ones that would otherwise finish last), each joined by waiting models
whose rates match its own, and when fewer models are left than GPUs, a model visits on
several GPUs of one node (data-parallel), as many as speed it up, up to its share of the
cluster. Visits end at different times, so a partition's GPUs would come free one at a time
and every visit would decode alone: new visits on a partition wait while a hop there is in
flight (a checkpoint: seconds), so that GPUs come free together and visits start together.
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
    reads_rates = False

    def __init__(self, options: NoOptions = NoOptions(), seed: int = 0):
        self.rng = np.random.default_rng(seed)

    def fill(self, view: ClusterView) -> Decision:
        idle = view.waiting()
        visited = {m.id: m.visited for m in view.models}
        able: dict[int, list[str]] = {}  # partition -> the idle models yet to visit it, in order
        plans = []
        for g in view.free_gpus:
            partition = view.partitions.of_gpu(g)
            if partition not in able:
                able[partition] = [m for m in idle if partition not in visited[m]]
            if able[partition]:
                model = able[partition][int(self.rng.integers(len(able[partition])))]
                idle.remove(model)
                for unvisited, models in able.items():
                    if unvisited not in visited[model]:
                        models.remove(model)
                plans.append(StreamPlan((Member(model, (g,)),)))
        return Decision.launching(plans)


@dataclass(frozen=True)
class FleetHopOptions(PolicyOptions):
    """`fleet-hop`'s options.

    Attributes:
        delta: models whose rates differ by at most this fraction of the faster one share a
            stream; in (0, 1].
        window: how far down the most-work-first order a model may be picked to share a
            stream: among the first ``window`` times as many models as the partition has free
            GPUs (None: any waiting model); 1 keeps the order strictly.
    """

    delta: float = option(DEFAULT_RELATIVE_DELTA, gt=0, le=1)
    window: float | None = option(None, ge=1, optional=True)


class FleetHop(_Hopper):
    """Model hopping with shared streams, longest work first and multi-GPU visits in the tail.

    Args:
        options: :class:`FleetHopOptions`.
        seed: unused (the policy is deterministic); accepted for a uniform constructor.
    """

    name = "fleet-hop"
    Options = FleetHopOptions
    uses_refined_rates = True  # each visit is planned afresh: the runtime adopts measured rates unweighed

    def __init__(self, options: FleetHopOptions = FleetHopOptions(), seed: int = 0):
        self.delta = options.delta
        self.window = options.window
        self.launched = 0
        self.launches: dict[str, int] = {}  # each model's last launch: streams launched at once share an id
        self.awaited: dict[int, set[str]] = {}  # per partition with free GPUs: the hops in flight then

    def fill(self, view: ClusterView) -> Decision:
        leaving, waiting = hops_in_flight(view, self.launches)
        work = {m: remaining_work(view, m) for m in view.waiting() if m not in waiting}
        idle = sorted(work, key=lambda m: -work[m])
        left = len(view.models) - len(view.ids_in(ModelState.CONVERGED))
        share = max(1, view.total_gpus // max(1, left))  # GPUs a model may take: its share of the cluster
        plans: list[StreamPlan] = []
        visited = {m.id: m.visited for m in view.models}
        for partition, free in sorted(free_by_partition(view).items()):
            # wait for the hops in flight when a GPU here first came free (not for later ones:
            # the wait ends within one checkpoint)
            awaited = self.awaited.setdefault(partition, leaving.get(partition, set()))
            if awaited & leaving.get(partition, set()):
                continue
            del self.awaited[partition]
            able = [m for m in idle if partition not in visited[m]]
            picks = matched_picks(view, able, len(free), self.delta, self.window)
            counts = visit_gpus(view, picks, work, len(free), min(share, view.gpus_per_node))
            if not counts:
                continue
            for m in counts:
                idle.remove(m)
            plans.extend(rate_matched_streams(view, counts, free, self.delta))
        for plan in plans:
            self.launched += 1
            self.launches.update((member.model, self.launched) for member in plan.members)
        return Decision.launching(plans)


def hops_in_flight(view: ClusterView, launches: dict[str, int]) -> tuple[dict[int, set[str]], set[str]]:
    """Per partition, the models about to leave its GPUs (a model that hops, checkpointing on
    its GPUs, or whose stream's pass ended: of the models launched together, by `launches`'
    ids, one already left and the others leave with it); and the waiting models whose
    launch-mates are still leaving. New visits wait for them, so that visits starting
    together can share a stream, instead of each taking a GPU as it comes free."""
    holding = {m.id: m for m in view.models if m.gpus}
    together: dict[int, list[str]] = {}
    for model, launch in launches.items():
        together.setdefault(launch, []).append(model)
    leaving: dict[int, set[str]] = {}
    waiting = set()
    for m in view.models:
        mates = together.get(launches.get(m.id, -1), ())
        if m.id not in holding:
            if any(x in holding for x in mates):
                waiting.add(m.id)
        elif m.state is ModelState.CHECKPOINTING or not all(x in holding for x in mates):
            leaving.setdefault(view.partitions.of_gpu(m.gpus[0]), set()).add(m.id)
    return leaving, waiting


def remaining_work(view: ClusterView, model_id: str) -> float:
    """Seconds a model still needs on one GPU: its estimated epochs left, less the partitions
    it visited in its current epoch (at least the rest of this epoch)."""
    model = view.model(model_id)
    partitions = view.partitions
    seen = partitions.share(model.visited)
    left = max(model.epochs_estimate - model.epochs_done - seen, 1.0 - seen)
    return left * partitions.samples / view.rates.rate(model_id, 1)


def matched_picks(view: ClusterView, able: Sequence[str], free: int, delta: float,
                  window: float | None) -> list[str]:
    """The models to visit one partition with `free` GPUs, most work first: each model in
    turn leads, and the models whose rates stay within `delta` of its group's join it, from
    the first `window` times `free` models of `able` (most work first; None: all), so visits
    that start together share a stream instead of each decoding its own."""
    pool = list(able if window is None else able[: max(free, int(window * free))])
    picks: list[str] = []
    while pool and len(picks) < free:
        group = [pool.pop(0)]
        low = high = view.rates.rate(group[0], 1)
        for m in list(pool):
            if len(picks) + len(group) == free:
                break
            rate = view.rates.rate(m, 1)
            if min(low, rate) >= (1 - delta) * max(high, rate):
                group.append(m)
                pool.remove(m)
                low, high = min(low, rate), max(high, rate)
        picks += group
    return picks


def visit_gpus(view: ClusterView, able: Sequence[str], work: dict[str, float], free: int,
               most: int) -> dict[str, int]:
    """GPUs for the next visits on one partition's `free` GPUs: one each to the first models of
    `able` (most `work` first), then, while GPUs are left, the next useful count (one that
    beats every smaller count) to the model that would take longest, up to `most` GPUs each."""
    counts = {m: 1 for m in able[:free]}
    spare = free - len(counts)
    if not counts or spare <= 0 or most <= 1:
        return counts
    table = view.rates.useful_matrix(most)
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
