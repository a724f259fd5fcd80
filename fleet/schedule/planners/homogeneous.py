"""Homogeneous: data sharing designed for identical models (Pittman et al., 2018).

Each round takes a random subset of the remaining models, one per GPU (up to ``M``), and
trains them on one shared stream, which moves at the pace of its slowest member. The next
round starts only when every member of the current one has converged.
"""

from __future__ import annotations

import numpy as np

from fleet.schedule._base import (
    NO_DECISION,
    ClusterView,
    Decision,
    Member,
    ModelConverged,
    Policy,
    StreamPlan,
)
from fleet.schedule.options import NoOptions


class Homogeneous(Policy):
    """Rounds of randomly chosen single-GPU models on one shared stream.

    Args:
        options: none (:class:`~fleet.schedule.options.NoOptions`); accepted for a uniform constructor.
        seed: seeds the random order of the models.
    """

    name = "homogeneous"
    uses_refined_rates = False  # the order is random, the GPUs one per model

    def __init__(self, options: NoOptions = NoOptions(), seed: int = 0):
        self.rng = np.random.default_rng(seed)
        self.queue: list[str] = []

    def start(self, view: ClusterView) -> Decision:
        self.queue = [view.rates.ids[i] for i in self.rng.permutation(len(view.models))]
        return self._next_round(view)

    def on_converged(self, event: ModelConverged, view: ClusterView) -> Decision:
        return self._next_round(view) if view.drained else NO_DECISION

    def _next_round(self, view: ClusterView) -> Decision:
        take = min(len(self.queue), len(view.free_gpus))
        if take == 0:
            return NO_DECISION
        models, self.queue = self.queue[:take], self.queue[take:]
        members = tuple(Member(m, (g,)) for m, g in zip(models, view.free_gpus))
        return Decision.launching([StreamPlan(members)])
