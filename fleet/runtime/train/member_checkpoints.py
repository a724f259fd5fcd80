"""A member's checkpoints of its model: what it restores when its group starts and what its
master saves after each epoch and when the group leaves."""

from __future__ import annotations

import time
from typing import Any

from fleet.runtime.protocol import StartMember
from fleet.runtime.train.checkpoint import CheckpointStore, ModelCheckpoint
from fleet.runtime.train.stop import StopTracker


class MemberCheckpoints:
    """Restores a model at the start of a member's stint, when its `StartMember` says so (the
    engine's state, the stop tracker, the epoch history, the GPU seconds so far, the position
    and sums of the epoch it stopped in, the partitions visited in that epoch), and saves it
    where it stands: after each epoch, and at a leave that keeps its place. Every trainer of
    the group restores; only the master saves. Owned by the member's `GroupTraining`.

    Args:
        run_dir: the run directory (its checkpoints).
        model: the model's spec.
        start: the member's command (round, stream, epoch limit, whether to resume).
        is_master: this trainer is the group's master.
        size: trainers in the group.
        costs: where the seconds of each save are counted (`MemberCosts`).

    Attributes:
        history: the model's epoch records, oldest first.
        gpu_seconds: GPU seconds the model has trained, over all its stints.
        resumed_sums: (loss sum, compute seconds) of the epoch restored mid-way, as saved.
        epoch_sums: the same of the epoch this stint leaves mid-way, saved with its checkpoint.
    """

    def __init__(self, run_dir: str, model: Any, start: StartMember, is_master: bool, size: int, costs: Any):
        self.store = CheckpointStore(run_dir)
        self.model, self.start, self.is_master, self.size, self.costs = model, start, is_master, size, costs
        self.history: list[dict] = []
        self.gpu_seconds = 0.0
        self.resumed_sums = (0.0, 0.0)
        self.epoch_sums = (0.0, 0.0)

    def restore(self, engine: Any, tracker: StopTracker, visit: Any) -> tuple[StopTracker, int]:
        """Load the model's newest checkpoint into `engine` and `visit` when the command says so;
        returns the stop tracker to go on with (`tracker` when nothing was loaded) and the
        position in the epoch (its samples trained)."""
        if not self.start.resume:
            return tracker, 0
        checkpoint = self.store.load(self.model.id)
        if checkpoint is None:
            return tracker, 0
        engine.load_state_bytes(checkpoint.engine_state)
        tracker = StopTracker.from_dict(self.model.train.stop, checkpoint.stop)
        tracker.max_epochs = self.start.epoch_limit or self.model.train.max_epochs
        self.history = list(checkpoint.history)
        self.gpu_seconds = checkpoint.gpu_seconds
        self.resumed_sums = (float(checkpoint.meta.get("epoch_loss_sum", 0.0)),
                             float(checkpoint.meta.get("epoch_compute_s", 0.0)))
        if visit is not None:
            visit.visited = tuple(int(k) for k in checkpoint.meta.get("visited", ()))
        return tracker, checkpoint.epoch_samples

    def save(self, engine: Any, tracker: StopTracker, epoch_samples: int, visit: Any) -> None:
        """The master saves the model where it stands, `epoch_samples` into its epoch (the
        other members return at once)."""
        if not self.is_master:
            return
        started = time.monotonic()
        reason = tracker.reason
        checkpoint = ModelCheckpoint(
            model_id=self.model.id, engine_state=engine.state_bytes(), stop=tracker.to_dict(),
            history=self.history, epochs=tracker.epochs, epoch_samples=epoch_samples,
            gpu_seconds=self.gpu_seconds, converged=reason is not None,
            stop_reason=reason.value if reason else None,
            meta={"round": self.start.round, "stream": self.start.layout.stream, "gpus": self.size,
                  "epoch_loss_sum": self.epoch_sums[0], "epoch_compute_s": self.epoch_sums[1],
                  **({"visited": list(visit.visited)} if visit else {})},
        )
        self.store.save(checkpoint)
        self.costs.saved(time.monotonic() - started)
