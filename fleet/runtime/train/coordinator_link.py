"""A group master's messages with the coordinator while its group trains."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from fleet.runtime.context import RunContext
from fleet.runtime.protocol import CheckpointModel, KeepAlive, Progress, RungVerdict, Tag
from fleet.runtime.waiting import IDLE, WaitTimeout, send_object

PROGRESS_EVERY_S = 10.0


class CoordinatorLink:
    """The commands a group's master polls between steps and the reports it sends rank 0.

    A `CheckpointModel` of one of its models asks that model to leave; at a rung (early
    stopping) the master waits for the model's `RungVerdict` (`await_verdict`); any other
    command but a `KeepAlive` (the next `StartMember`, a `Shutdown`) is kept in
    `RunContext.pending` for the trainer loop. A bundle's master has several models: what comes
    for one while it waits for another's is kept for it. Reports go on the REPORT tag: epoch
    reports, a progress report at most every `PROGRESS_EVERY_S` (a quarter of the timeout where
    that is shorter), a visit's end, a stream-end claim. Owned by the member's `GroupTraining`
    (or `BundleTraining`); used on the master only.

    Args:
        ctx: the rank's context (its control communicator, timeout and pending commands).
        model: the id of the model the group trains (a bundle's first; its progress reports).
        models: a bundle's models (default: `model` alone).
    """

    def __init__(self, ctx: RunContext, model: str, models: Sequence[str] = ()):
        self.ctx, self.model = ctx, model
        self.models = frozenset(models or (model,))
        self.asked: set[str] = set()  # models a checkpoint command asked to leave, not yet taken
        self.verdicts: dict[str, RungVerdict] = {}  # verdicts that came for models not yet waiting
        self.last_progress = time.monotonic()

    def poll_commands(self) -> bool:
        """Take the commands that came; True when one asked `model` to leave (a checkpoint)."""
        while (message := self.ctx.ctrl.improbe(source=0, tag=Tag.TRAINER)) is not None:
            self._keep(message.recv())
        return self.model in self.asked

    def take_asked(self) -> set[str]:
        """The models the commands taken so far asked to leave (each once)."""
        asked, self.asked = self.asked, set()
        return asked

    def await_verdict(self, epoch: int, model: str | None = None) -> RungVerdict | None:
        """Wait at the rung of `epoch` (early stopping) for the coordinator's verdict on `model`
        (default: the group's): the `RungVerdict`, or None when a `CheckpointModel` of it came
        first (the model is held at the rung, or its round ended): it leaves. Keep-alives
        extend the wait."""
        model = model or self.model
        deadline = time.monotonic() + self.ctx.timeout_s
        sleeps = IDLE.sleeps()
        while True:
            if model in self.verdicts:
                return self.verdicts.pop(model)
            if model in self.asked:
                self.asked.discard(model)
                return None
            message = self.ctx.ctrl.improbe(source=0, tag=Tag.TRAINER)
            if message is None and time.monotonic() > deadline:
                raise WaitTimeout(f"timed out after {self.ctx.timeout_s:g} s waiting for the verdict on {model} "
                                  f"at its rung of {epoch} epochs")
            if message is None:
                time.sleep(next(sleeps))
                continue
            command = message.recv()
            if isinstance(command, KeepAlive):
                deadline = time.monotonic() + self.ctx.timeout_s
            self._keep(command)

    def _keep(self, command: Any) -> None:
        """File a command that came: a checkpoint or verdict of one of the group's models, or
        (anything but a keep-alive, or another model's) for the trainer loop."""
        if isinstance(command, CheckpointModel) and self.models.intersection(command.ids):
            self.asked.update(self.models.intersection(command.ids))
        elif isinstance(command, RungVerdict) and command.model in self.models:
            self.verdicts[command.model] = command
        elif not isinstance(command, (KeepAlive, CheckpointModel, RungVerdict)):
            self.ctx.pending.append(command)

    def report(self, message: Any, what: str) -> None:
        """Send the coordinator `message` (`what` it is, for a wait that times out)."""
        send_object(self.ctx.ctrl, message, 0, Tag.REPORT, f"the coordinator to take {what}", self.ctx.timeout_s)

    def maybe_progress(self, epochs: int, samples: int, since: float) -> None:
        """A progress report (epochs done, `samples` into the epoch that began at `since`), when due."""
        now = time.monotonic()
        if now - self.last_progress < min(PROGRESS_EVERY_S, self.ctx.timeout_s / 4):
            return
        self.last_progress = now
        rate = samples / max(1e-9, now - since)
        self.report(Progress(self.model, epochs, samples, rate), "a progress report")
