"""Baseline: what users run without fleet, one training script per model, N at a time.

Models are taken in a random order (seeded); whenever a GPU is free it takes the next
remaining model, which decodes its own data in its own trainer process between its steps
(`StreamPlan.own_decoding`), as a script's DataLoader does: no preprocessor decodes for it,
and nothing is shared. So "x Baseline" is "x what users do now".
"""

from __future__ import annotations

from fleet.schedule._base import NO_DECISION, ClusterView, Decision, ModelConverged
from fleet.schedule.planners._common import RandomOrder, single_gpu_streams


class Baseline(RandomOrder):
    """Independent single-GPU training, a free GPU takes a random remaining model that
    decodes its own data."""

    name = "baseline"
    own_decoding = True

    def on_converged(self, event: ModelConverged, view: ClusterView) -> Decision:
        return self.on_free(view)

    def on_free(self, view: ClusterView) -> Decision:
        models = self.take(view)
        return Decision.launching(single_gpu_streams(models, view.free_gpus, own_decoding=True)) if models else NO_DECISION
