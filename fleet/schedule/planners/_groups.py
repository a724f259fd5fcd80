"""What the policies over groups share (issue 47): each group's waiting models, their work,
GPUs handed out in rate-matched counts, and one stream per group on given GPUs.

A model of grouped data (`fleet.schedule.grouping.group_of`) trains its group's samples only;
these policies never put two groups' models in one stream. On data without groups every model
is of the one group ``None``.
"""

from __future__ import annotations

from collections.abc import Sequence

from fleet.schedule._base import (
    CheckpointCompleted,
    ClusterView,
    Decision,
    Member,
    ModelConverged,
    ModelPromoted,
    ModelState,
    Policy,
    StreamPlan,
)
from fleet.schedule.grouping import group_of
from fleet.schedule.options import NoOptions
from fleet.schedule.placement import place
from fleet.schedule.rates import RateTable


def model_work(view: ClusterView, model_id: str) -> float:
    """GPU-seconds `model_id` has left on one GPU: its epochs left (at least a tenth of one)
    times an epoch's samples over its one-GPU rate (epoch-equivalent: n_g x E / r)."""
    model = view.model(model_id)
    left = max(model.epochs_estimate - model.epochs_done, 0.1)
    return left * view.rates.samples_per_epoch / view.rates.profile(model_id).rate(1, view.gpus_per_node)


def matched_counts(rates: RateTable, models: Sequence[str], gpus: int) -> list[int]:
    """GPUs per model of one stream: one each, then each GPU left to the model that is then
    slowest (a stream moves at its slowest member's pace). `gpus` >= len(models)."""
    counts = [1] * len(models)
    gpn = rates.gpus_per_node
    for _ in range(gpus - len(models)):
        slowest = min(range(len(models)), key=lambda i: (rates.profile(models[i]).rate(counts[i], gpn), i))
        counts[slowest] += 1
    return counts


def group_stream(rates: RateTable, models: Sequence[str], gpus: Sequence[int], join: int | None = None) -> StreamPlan:
    """`models` (of one group) on `gpus`: as many of them as there are GPUs, in order, with the
    GPUs rate-matched (`matched_counts`) and placed node-locally (Alg. 3/4); into running
    stream `join` when given."""
    models = list(models)[:len(gpus)]
    counts = matched_counts(rates, models, len(gpus))
    runs = place(counts, gpus, rates.gpus_per_node)
    return StreamPlan(tuple(Member(m, run) for m, run in zip(models, runs)), join=join)


def free_by_node(view: ClusterView) -> dict[int, list[int]]:
    """The free GPUs of each node that has some, by node."""
    nodes: dict[int, list[int]] = {}
    for g in view.free_gpus:
        nodes.setdefault(g // view.gpus_per_node, []).append(g)
    return nodes


def group_streams(view: ClusterView) -> dict[str | None, tuple[int, set[int]]]:
    """Each group with a running stream: (stream id, the nodes its members train on); the
    first stream found where a group has several."""
    found: dict[str | None, tuple[int, set[int]]] = {}
    for stream in view.streams:
        members = [view.model(m) for m in stream.members]
        nodes = {g // view.gpus_per_node for m in members for g in m.gpus}
        found.setdefault(group_of(view.rates, members[0].id), (stream.id, nodes))
    return found


class GroupPolicy(Policy):
    """A policy over groups: it keeps each group's models waiting to run (`waiting`, in the
    rate table's order) and plans, in `fill`, whenever GPUs come free.

    Args:
        options: none (:class:`~fleet.schedule.options.NoOptions`).
        seed: unused (the order is by work, ties by name).
    """

    uses_refined_rates = False  # the groups' order and places are planned once, at the start

    def __init__(self, options: NoOptions = NoOptions(), seed: int = 0):
        self.waiting: dict[str | None, list[str]] = {}
        self.work: dict[str | None, float] = {}

    def start(self, view: ClusterView) -> Decision:
        for model in view.waiting():
            self.waiting.setdefault(group_of(view.rates, model), []).append(model)
        self.work = {g: sum(model_work(view, m) for m in models) for g, models in self.waiting.items()}
        self.plan(view)
        return self.fill(view)

    def plan(self, view: ClusterView) -> None:
        """Plan the groups' order or places once, at the start (`self.work` is known)."""

    def fill(self, view: ClusterView) -> Decision:
        """Launch what the free GPUs of `view` should train now."""
        raise NotImplementedError

    def largest_first(self) -> list[str | None]:
        """The groups with waiting models, the most work first (ties by key)."""
        return sorted((g for g, models in self.waiting.items() if models), key=lambda g: (-self.work[g], str(g)))

    def launch(self, group: str | None, gpus: list[int], view: ClusterView, join: int | None = None) -> StreamPlan:
        """A stream of `group`'s waiting models on `gpus` (`group_stream`; into running stream
        `join` when given); the GPUs it takes leave `gpus` and its models the waiting list."""
        plan = group_stream(view.rates, self.waiting[group], gpus, join)
        used = {g for member in plan.members for g in member.gpus}
        gpus[:] = [g for g in gpus if g not in used]
        for member in plan.members:
            self.waiting[group].remove(member.model)
        return plan

    def join_running(self, node: int, gpus: list[int], running: dict, view: ClusterView) -> list[StreamPlan]:
        """The waiting models of groups whose stream trains on `node` join it there, a GPU each."""
        plans = []
        for group, (stream, nodes) in running.items():
            if node in nodes and self.waiting.get(group) and gpus:
                plans.append(self.launch(group, gpus[:len(self.waiting[group])], view, join=stream))
                gpus[:] = gpus[len(plans[-1].members):]
        return plans

    def on_converged(self, event: ModelConverged, view: ClusterView) -> Decision:
        return self.fill(view)

    def on_checkpointed(self, event: CheckpointCompleted, view: ClusterView) -> Decision:
        if view.model(event.model).state is ModelState.PAUSED:  # not HELD at a rung
            self.waiting.setdefault(group_of(view.rates, event.model), []).append(event.model)
        return self.fill(view)

    def on_promoted(self, event: ModelPromoted, view: ClusterView) -> Decision:
        waiting = self.waiting.setdefault(group_of(view.rates, event.model), [])
        # promoted while its hold was saved, it came back PAUSED (on_checkpointed): it waits, or runs, already
        if view.model(event.model).state is ModelState.PAUSED and event.model not in waiting:
            waiting.append(event.model)
        return self.fill(view)
