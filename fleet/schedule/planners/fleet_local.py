"""FLEET-L: the paper's local paradigm (released GPUs are refilled at once).

Our reading of Guan et al. (MLSys 2020), Sec. 4: in the local paradigm a model that
converges hands its GPUs straight to models that have not started yet; the models already
training are never interrupted, so there is no checkpoint and no re-flotillation. We form
the refill as a new flotilla -- Alg. 2 over the not-yet-started models, restricted to the
GPUs just released (plus any still free), placed by Alg. 3/4 -- which gets its own shared
stream, since its members start at epoch 0 while the running streams are mid-way. Where
Alg. 2 leaves GPUs free (no waiting model matches that stream's pace), a flotilla of the
models still waiting takes them, on a stream of its own, until no GPU or no model is left.
When no model is left to start, released GPUs stay idle until the end. A run resumed from
checkpoints starts its partly trained (``PAUSED``) models as it starts untouched ones.
(The paper's full text was not retrievable through our search tool, only its abstract; this
reading is from the paper's description of the two paradigms, and the global/local
contrast it draws.)
"""

from __future__ import annotations

from dataclasses import dataclass

from fleet.schedule._base import NO_DECISION, CheckpointCompleted, ClusterView, Decision, ModelConverged, Policy
from fleet.schedule.options import PolicyOptions, option
from fleet.schedule.planners._common import flotilla_stream


@dataclass(frozen=True)
class FleetLocalOptions(PolicyOptions):
    """FLEET-L's options.

    Attributes:
        delta: Alg. 2's rate tolerance in samples/s, positive (``None``: 10 % of ``r_fast``).
    """

    delta: float | None = option(None, gt=0, optional=True)


class FleetLocal(Policy):
    """FLEET's local paradigm.

    Args:
        options: delta (:class:`FleetLocalOptions`).
        seed: unused (the policy is deterministic); accepted for a uniform constructor.
    """

    name = "fleet-l"
    Options = FleetLocalOptions

    def __init__(self, options: FleetLocalOptions = FleetLocalOptions(), seed: int = 0):
        self.delta = options.delta

    def start(self, view: ClusterView) -> Decision:
        return self._refill(view)

    def on_converged(self, event: ModelConverged, view: ClusterView) -> Decision:
        return self._refill(view)

    def on_checkpointed(self, event: CheckpointCompleted, view: ClusterView) -> Decision:
        """GPUs came free by a checkpoint (a model held at a rung, a resize): fill them."""
        return self._refill(view)

    def _refill(self, view: ClusterView) -> Decision:
        """Flotillas of the waiting models on the free GPUs, one stream each, until either
        runs out (Alg. 2 leaves GPUs free when no waiting model matches its stream's pace)."""
        waiting, free = view.waiting(), list(view.free_gpus)
        streams = []
        while waiting and free:
            stream = flotilla_stream(view.rates, waiting, free, view.gpus_per_node, self.delta)
            if not stream.members:
                break
            streams.append(stream)
            taken = {m.model for m in stream.members}
            used = {g for m in stream.members for g in m.gpus}
            waiting = [m for m in waiting if m not in taken]
            free = [g for g in free if g not in used]
        return Decision.launching(streams) if streams else NO_DECISION
