"""A group master's messages with the coordinator while its group trains."""

from __future__ import annotations

import time
from typing import Any

from fleet.runtime.context import RunContext
from fleet.runtime.protocol import CheckpointModel, KeepAlive, Progress, RungVerdict, Tag
from fleet.runtime.waiting import IDLE, WaitTimeout, send_object

PROGRESS_EVERY_S = 10.0


class CoordinatorLink:
    """The commands a group's master polls between steps and the reports it sends rank 0.

    A `CheckpointModel` of its model asks the group to leave; at a rung (early stopping) the
    master waits for a `RungVerdict` (`await_verdict`); any other command but a `KeepAlive` (the next `StartMember`, a `Shutdown`) is kept in `RunContext.pending` for the
    trainer loop. Reports go on the REPORT tag: epoch reports, a progress report at most every
    `PROGRESS_EVERY_S` (a quarter of the timeout where that is shorter), a visit's end, a
    stream-end claim. Owned by the member's `GroupTraining`; used on the master only.

    Args:
        ctx: the rank's context (its control communicator, timeout and pending commands).
        model: the id of the model the group trains.
    """

    def __init__(self, ctx: RunContext, model: str):
        self.ctx, self.model = ctx, model
        self.last_progress = time.monotonic()

    def poll_commands(self) -> bool:
        """Take the commands that came; True when one asks this model to leave (a checkpoint)."""
        asked = False
        while (message := self.ctx.ctrl.improbe(source=0, tag=Tag.TRAINER)) is not None:
            command = message.recv()
            if isinstance(command, CheckpointModel) and command.model == self.model:
                asked = True
            elif not isinstance(command, (KeepAlive, CheckpointModel)):
                self.ctx.pending.append(command)
        return asked

    def await_verdict(self, epoch: int) -> RungVerdict | None:
        """Wait at the rung of `epoch` (early stopping) for the coordinator's verdict: the
        `RungVerdict`, or None when a `CheckpointModel` came first (the model is held at the
        rung, or its round ended): the group leaves. Keep-alives extend the wait."""
        deadline = time.monotonic() + self.ctx.timeout_s
        sleeps = IDLE.sleeps()
        while True:
            message = self.ctx.ctrl.improbe(source=0, tag=Tag.TRAINER)
            if message is None and time.monotonic() > deadline:
                raise WaitTimeout(f"timed out after {self.ctx.timeout_s:g} s waiting for the verdict on {self.model} "
                                  f"at its rung of {epoch} epochs")
            if message is None:
                time.sleep(next(sleeps))
                continue
            command = message.recv()
            if isinstance(command, RungVerdict) and command.model == self.model:
                return command
            if isinstance(command, CheckpointModel) and command.model == self.model:
                return None
            if isinstance(command, KeepAlive):
                deadline = time.monotonic() + self.ctx.timeout_s
            elif not isinstance(command, (CheckpointModel, RungVerdict)):
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
