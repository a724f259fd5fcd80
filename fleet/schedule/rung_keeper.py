"""Early stopping in the driver: rung decisions become the books' states, world calls and events.

The `Driver` owns one `RungKeeper` when a run stops models early (`fleet.schedule.early_stop`).
Where the ledger records an epoch (or a model's own end), the keeper asks the run's
`EarlyStopping` for decisions, has the world record them before anything acts on them, and
gives the driver each model's verdict to carry out by the model's state:

* a ``RUNNING`` model is stopped (the world ends it at the epoch it reported, then reports
  `Driver.stopped`), held (checkpointed, then ``HELD``), or passes its rung;
* a ``CHECKPOINTING`` model (a hop, an end of round, a hold in progress) takes its verdict when
  its checkpoint is done (``HELD``, ``PAUSED`` or, stopped, ``CONVERGED``);
* a ``HELD`` model is promoted (``PAUSED``) or stopped (``CONVERGED``) at once.

Every policy sees the outcome through the protocol's events, so each honours it, and the
simulator predicts it exactly as the runtime carries it out.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from fleet.schedule._base import Event, ModelConverged, ModelPromoted, ModelState
from fleet.schedule.early_stop import EarlyStopping, RungDecision, Verdict
from fleet.schedule.ledger import Ledger

if TYPE_CHECKING:  # annotations only: the driver imports this module
    from fleet.schedule.driver import World


def final_verdicts(decisions: list[RungDecision]) -> dict[str, Verdict]:
    """Each model's verdict in a batch of decisions: the last about it stands (a model paused
    at a rung that its own arrival filled is promoted at once)."""
    return {d.model: d.verdict for d in decisions}


class RungKeeper:
    """The driver's early stopping over one ledger; see the module docstring.

    Args:
        early: the run's early stopping (its decisions so far are its state).
        ledger: the driver's books (each model's ``next_stop`` is kept there).
        world: the driver's world: it records decisions before they act (the run directory's
            rung log in the runtime; the result in the simulator), stops models and lets them
            pass their rungs.
    """

    def __init__(self, early: EarlyStopping, ledger: Ledger, world: World):
        self.early, self.ledger, self.world = early, ledger, world
        self.after_checkpoint: dict[str, Verdict] = {}  # a checkpointing model's verdict, for when it is done
        for view in ledger.views:
            self.next_stop(view.id)

    def epoch(self, model: str, epoch: int, metric: float | None) -> dict[str, Verdict]:
        """`model` completed `epoch` with `metric` (lower is better): the verdicts it brings. A
        model at its rung gets one, ``CONTINUE`` where nothing was decided about it (``median``
        with too few models): the runtime's master waits there for its verdict."""
        at_rung = self.ledger.model(model).next_stop == epoch
        verdicts = self._decided(self.early.epoch_ended(model, epoch, metric))
        self.next_stop(model)
        if at_rung:
            verdicts.setdefault(model, Verdict.CONTINUE)
        return verdicts

    def ended(self, model: str, epochs: int) -> dict[str, Verdict]:
        """`model`'s own stop rule ended it (not early stopping): it is waited for no more."""
        return self._decided(self.early.model_ended(model, epochs))

    def checkpointed_state(self, model: str) -> tuple[ModelState, bool]:
        """The state a model takes when its checkpoint is done -- ``HELD`` at a rung, ``CONVERGED``
        when stopped meanwhile, else ``PAUSED`` -- and whether it was promoted meanwhile (held
        at its rung, the rung filled before its checkpoint was done)."""
        verdict = self.after_checkpoint.pop(model, None)
        if verdict is Verdict.STOPPED:
            return ModelState.CONVERGED, False
        if verdict is Verdict.PAUSED:
            return ModelState.HELD, False
        return ModelState.PAUSED, verdict is Verdict.PROMOTED

    def next_stop(self, model: str) -> None:
        """Keep the model's next rung in the books (none once it is stopped)."""
        stopped = self.early.is_stopped(model)
        epochs = self.ledger.model(model).epochs_done
        self.ledger.set_next_stop(model, None if stopped else self.early.next_stop(model, epochs))

    def settle_held(self, verdicts: dict[str, Verdict], now: float) -> list[Event]:
        """The books of the models held at a rung, changed at once (promoted: ``PAUSED``;
        stopped: ``CONVERGED``), and their events, for the driver to deliver before the policy
        plans again: no policy call sees a rung half filled, nor a stall while promoted models
        wait to be told."""
        events: list[Event] = []
        for model, verdict in verdicts.items():
            if self.ledger.model(model).state is not ModelState.HELD:
                continue
            if verdict is Verdict.PROMOTED:
                self.ledger.promote(model)
                events.append(ModelPromoted(model, now))
            elif verdict is Verdict.STOPPED:
                epochs = self.ledger.model(model).epochs_done
                self.ledger.release(model, ModelState.CONVERGED)
                events.append(ModelConverged(model, epochs, now, (), 0.0, stopped=True))
        return events

    def carry_out(self, verdicts: dict[str, Verdict], checkpoint: Callable[[str], None]) -> None:
        """The verdicts on models not held (`settle_held` took those), by each one's state now:
        a running model is stopped, held (`checkpoint`, the driver's) or passes its rung; a
        checkpointing one takes its verdict when its checkpoint is done."""
        for model, verdict in verdicts.items():
            state = self.ledger.model(model).state
            if state is ModelState.CHECKPOINTING:
                self.after_checkpoint[model] = verdict
            elif state is ModelState.RUNNING and verdict is Verdict.STOPPED:
                self.world.stop(model)
            elif state is ModelState.RUNNING and verdict is Verdict.PAUSED:
                self.after_checkpoint[model] = verdict
                checkpoint(model)
            elif state is ModelState.RUNNING:
                self.world.rung_passed(model)

    def _decided(self, decisions: list[RungDecision]) -> dict[str, Verdict]:
        if decisions:
            self.world.record_rungs(decisions)
        return final_verdicts(decisions)
