"""Baseline: every model alone on one GPU with its own preprocessing.

Models are taken in a random order (seeded); whenever a GPU is free it takes the next
remaining model, which then decodes its own data (a stream of one member).
"""

from __future__ import annotations

from fleet.schedule._base import NO_DECISION, ClusterView, Decision, ModelConverged
from fleet.schedule.planners._common import RandomOrder, single_gpu_streams


class Baseline(RandomOrder):
    """Independent single-GPU training, a free GPU takes a random remaining model."""

    name = "baseline"

    def on_converged(self, event: ModelConverged, view: ClusterView) -> Decision:
        return self.on_free(view)

    def on_free(self, view: ClusterView) -> Decision:
        models = self.take(view)
        return Decision.launching(single_gpu_streams(models, view.free_gpus)) if models else NO_DECISION
