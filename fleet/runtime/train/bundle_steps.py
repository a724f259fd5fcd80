"""A bundle's steps on its trainer (issue 49): its engine, fused or its models one by one, and
under `runtime.fuse: auto` the trial that times both ways on the bundle's first steps and keeps
the faster (`fleet.schedule.bundle_ways`).

Every step trains every model on the batch once, whichever way; a change of way rebuilds the
engine from its models' states as they stand (`fleet.engines.bundle.rebuilt`), so each model
trains exactly as it would alone. A model that leaves mid-trial restarts it for the others (the
steps timed so far trained more models); with one model left there is nothing to decide.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from fleet.engines.bundle import create_bundle, rebuilt
from fleet.engines.options import EngineOptions
from fleet.rows import Rows
from fleet.schedule.bundle_ways import Way, WayDecision, WayTrial


class BundleSteps:
    """The engine a bundle steps, and the way it trains (see the module docstring).

    Args:
        options: each model's engine options, in the bundle's order (one device and threads).
        states: the engine bytes of each model that resumes from a checkpoint.
        way: ``fused`` or ``one_by_one``; None: a trial decides (on a real device; the emulated
            device's bundle is one by one whatever the way).
        min_speedup: the trial's (`fleet.schedule.bundle_ways.kept_way`).
        rates: the emulated device's rate table (None on a real device).
        epoch_limits: the emulated device's epochs to convergence by model.
    """

    def __init__(self, options: Sequence[EngineOptions], states: Mapping[str, bytes], way: str | None,
                 min_speedup: float = 1.0, rates: Any = None, epoch_limits: Mapping[str, int | None] | None = None):
        self.options = list(options)
        models = [o.model.id for o in self.options]
        self.trial = WayTrial(models, min_speedup) if way is None and rates is None else None
        self.way = self.trial.way if self.trial is not None else Way(way or Way.FUSED)
        self.kept = self.way  # the way to train once no trial is running
        self.engine = create_bundle(self.options, states, rates=rates, epoch_limits=epoch_limits,
                                    fused=self.way is Way.FUSED)

    def step(self, x: Rows, y: Any, whole: bool) -> tuple[dict[str, float], WayDecision | None]:
        """One step of every model on the batch (`whole`: a whole batch, which a trial times);
        each model's mean loss, and the trial's decision where this step made it."""
        self._follow()
        started = time.perf_counter()
        losses = self.engine.train_step(x, y)
        seconds = time.perf_counter() - started
        decision = self.trial.stepped(seconds, whole) if self.trial is not None else None
        if decision is not None:
            self.trial, self.kept = None, decision.kept
        return losses, decision

    def leave(self, model: str) -> None:
        """`model` leaves the bundle (others stay); a trial under way starts again without it."""
        self.engine.leave(model)
        if self.trial is None:
            return
        if len(self.engine.model_ids) > 1:
            self.trial.restart(self.engine.model_ids)
        else:
            self.trial, self.kept = None, self.way

    def _follow(self) -> None:
        """Rebuild the engine where the trial, or its decision, asks for the other way."""
        target = self.trial.way if self.trial is not None else self.kept
        if target is not self.way:
            self.engine = rebuilt(self.engine, self.options, fused=target is Way.FUSED)
            self.way = target
