"""FLEET-G: the paper's global paradigm (rounds of flotillas with re-flotillation).

Each round trains one flotilla (Alg. 2, placed by Alg. 3/4) on all GPUs with one shared
stream. A model that converges releases its GPUs at once; they stay idle until the round
ends, which happens as soon as fewer than ``alpha`` times the GPUs the round's flotilla
took are busy: ``alpha * M`` when it fills the cluster, as Alg. 2's leftovers make it
unless no member can use them (past the peak of its curve, or too few GPUs to move tied
copies up together). A flotilla that starts below ``alpha * M`` is then not ended by the
first convergence report, nor by a late one of the round before. Then every running
model is checkpointed, and when the last checkpoint is done a new flotilla is created from
all models not yet converged (*re-flotillation*).
"""

from __future__ import annotations

from dataclasses import dataclass

from fleet.schedule._base import (
    END_ROUND,
    NO_DECISION,
    CheckpointCompleted,
    ClusterView,
    Decision,
    ModelConverged,
    Policy,
)
from fleet.schedule.options import PolicyOptions, option
from fleet.schedule.planners._common import flotilla_stream


@dataclass(frozen=True)
class FleetGlobalOptions(PolicyOptions):
    """FLEET-G's options.

    Attributes:
        alpha: a round ends when fewer than ``alpha`` times the GPUs its flotilla took are
            busy; in (0, 1] (1: at the first convergence).
        delta: Alg. 2's rate tolerance in samples/s, positive (``None``: 10 % of ``r_fast``).
    """

    alpha: float = option(0.8, gt=0, le=1)
    delta: float | None = option(None, gt=0, optional=True)


class FleetGlobal(Policy):
    """FLEET's global paradigm.

    Args:
        options: alpha and delta (:class:`FleetGlobalOptions`).
        seed: unused (the policy is deterministic); accepted for a uniform constructor.
    """

    name = "fleet-g"
    Options = FleetGlobalOptions
    plans_only_when_drained = True

    def __init__(self, options: FleetGlobalOptions = FleetGlobalOptions(), seed: int = 0):
        self.alpha, self.delta = options.alpha, options.delta
        self.round_gpus = 0  # GPUs the running round's flotilla took

    def start(self, view: ClusterView) -> Decision:
        return self._new_round(view)

    def on_converged(self, event: ModelConverged, view: ClusterView) -> Decision:
        if view.drained:
            return self._new_round(view)
        if view.busy_gpus < self.alpha * self.round_gpus:
            return END_ROUND
        return NO_DECISION

    def on_checkpointed(self, event: CheckpointCompleted, view: ClusterView) -> Decision:
        return self._new_round(view) if view.drained else NO_DECISION

    def _new_round(self, view: ClusterView) -> Decision:
        candidates = view.waiting()
        if not candidates:
            return NO_DECISION
        stream = flotilla_stream(view.rates, candidates, view.free_gpus, view.gpus_per_node, self.delta)
        self.round_gpus = sum(len(member.gpus) for member in stream.members)
        return Decision.launching([stream])
