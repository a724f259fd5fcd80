"""Helpers the planners share: turning a flotilla into a placed stream; a random order of models."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fleet.schedule._base import (
    WAITING,
    CheckpointCompleted,
    ClusterView,
    Decision,
    Member,
    ModelPromoted,
    Policy,
    StreamPlan,
)
from fleet.schedule.flotilla import Flotilla, create_flotilla
from fleet.schedule.options import NoOptions
from fleet.schedule.placement import place
from fleet.schedule.rates import RateTable


def placed_stream(flotilla: Flotilla, free_gpus: Sequence[int], gpus_per_node: int) -> StreamPlan:
    """Place a flotilla's members on ``free_gpus`` (Alg. 3/4) as one new stream."""
    runs = place([m.gpus for m in flotilla.members], free_gpus, gpus_per_node)
    return StreamPlan(tuple(Member(m.model, run) for m, run in zip(flotilla.members, runs)))


def flotilla_stream(
    rates: RateTable,
    candidates: Sequence[str],
    free_gpus: Sequence[int],
    gpus_per_node: int,
    delta: float | None,
) -> StreamPlan:
    """Alg. 2 over ``candidates`` on ``free_gpus``, then Alg. 3/4: one new stream."""
    flotilla = create_flotilla(rates, candidates, len(free_gpus), delta)
    return placed_stream(flotilla, free_gpus, gpus_per_node)


def single_gpu_streams(models: Sequence[str], free_gpus: Sequence[int], own_decoding: bool = False) -> list[StreamPlan]:
    """One stream per model, each on one GPU (models and GPUs paired in order)."""
    return [StreamPlan((Member(m, (g,)),), own_decoding=own_decoding) for m, g in zip(models, free_gpus)]


class RandomOrder(Policy):
    """A policy that takes the models in one random order (seeded), a GPU each, from the
    front of the queue as GPUs come free (`take`); subclasses say when (`on_free`).

    Args:
        options: none (:class:`~fleet.schedule.options.NoOptions`); accepted for a uniform constructor.
        seed: seeds the random order of the models.
    """

    uses_refined_rates = False  # the order is random, the GPUs one per model
    reads_rates = False

    def __init__(self, options: NoOptions = NoOptions(), seed: int = 0):
        self.rng = np.random.default_rng(seed)
        self.queue: list[str] = []

    def start(self, view: ClusterView) -> Decision:
        """The queue: the models waiting to run, in a random order. A run handed over by
        ``policy: auto`` starts with some converged, running or held at a rung: those are not
        queued (a held model joins the queue when it is promoted)."""
        ids = view.rates.ids
        self.queue = [ids[i] for i in self.rng.permutation(len(view.models)) if view.models[i].state in WAITING]
        return self.on_free(view)

    def on_free(self, view: ClusterView) -> Decision:
        """GPUs may be free: launch what the policy launches now."""
        raise NotImplementedError

    def on_checkpointed(self, event: CheckpointCompleted, view: ClusterView) -> Decision:
        """A model held at a rung freed its GPUs: as a convergence."""
        return self.on_converged(event, view)

    def on_promoted(self, event: ModelPromoted, view: ClusterView) -> Decision:
        """A model held at a rung may train on: it goes to the back of the queue."""
        self.queue.append(event.model)
        return self.on_converged(event, view)

    def take(self, view: ClusterView) -> list[str]:
        """The next models, one per free GPU (as many as are left). A queued model that no
        longer waits is dropped: after a hand-over a paused model may be stopped or held at its
        rung, or promoted (queued again) while still queued."""
        models: list[str] = []
        while self.queue and len(models) < len(view.free_gpus):
            model = self.queue.pop(0)
            if view.model(model).state in WAITING and model not in models:
                models.append(model)
        return models
