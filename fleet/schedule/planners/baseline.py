"""Baseline: every model alone on one GPU with its own preprocessing.

Models are taken in a random order (seeded); whenever a GPU is free it takes the next
remaining model, which then decodes its own data (a stream of one member).
"""

from __future__ import annotations

import numpy as np

from fleet.schedule._base import NO_DECISION, ClusterView, Decision, ModelConverged, Policy
from fleet.schedule.options import NoOptions
from fleet.schedule.planners._common import single_gpu_streams


class Baseline(Policy):
    """Independent single-GPU training, a free GPU takes a random remaining model.

    Args:
        options: none (:class:`~fleet.schedule.options.NoOptions`); accepted for a uniform constructor.
        seed: seeds the random order of the models.
    """

    name = "baseline"
    uses_refined_rates = False  # the order is random, the GPUs one per model

    def __init__(self, options: NoOptions = NoOptions(), seed: int = 0):
        self.rng = np.random.default_rng(seed)
        self.queue: list[str] = []

    def start(self, view: ClusterView) -> Decision:
        self.queue = [view.rates.ids[i] for i in self.rng.permutation(len(view.models))]
        return self._fill(view)

    def on_converged(self, event: ModelConverged, view: ClusterView) -> Decision:
        return self._fill(view)

    def _fill(self, view: ClusterView) -> Decision:
        if not self.queue or not view.free_gpus:
            return NO_DECISION
        take = min(len(self.queue), len(view.free_gpus))
        models, self.queue = self.queue[:take], self.queue[take:]
        return Decision.launching(single_gpu_streams(models, view.free_gpus))
