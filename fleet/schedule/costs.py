"""What re-planning costs: checkpoint, restore and planning time.

A checkpoint writes a model's parameters and optimizer state (``state_factor`` bytes per
parameter byte: the parameters plus two moment buffers for Adam, or a momentum buffer and a
copy of the gradients for SGD) to the parallel file system; a restore reads them back and
rebuilds the training group. Each costs ``latency_s + state_factor * param_bytes / bandwidth``.
The latency covers what does not scale with size: draining the input queue, tearing down
and re-creating communicators, rebuilding the model and warming up the first step.

The defaults (5 s + 3 x parameter bytes at 1 GB/s per model, i.e. about 5.3 s for a
100 MB model, done by all models in parallel) are chosen so that a re-flotillation costs a
few percent of a round in the paper's setting (100 ResNet/DenseNet variants on
Caltech-256), the level the FLEET paper reports; ``bench/RESULTS.md`` records the share
actually measured and a run with three times heavier costs.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Overheads:
    """Costs a driver pays around re-planning.

    Attributes:
        latency_s: fixed part of one checkpoint or restore, seconds.
        bandwidth: bytes per second one model's checkpoint writer (or reader) gets.
        state_factor: checkpoint bytes per parameter byte.
        default_param_bytes: size assumed for a model whose profile has no ``param_bytes``.
        planning_s: seconds charged for each policy call that launches something; ``None``
            means "measure it" with ``time.perf_counter`` (not deterministic).
        start_s: seconds from any member's launch to its first step, besides a restore
            (group set-up, the stream's first data); the runtime's weighing of measured rates
            sets it from what its members took.
        join_samples: samples a member joining a running stream waits for the stream to pass
            before its first chunk (the runtime switches members at a chunk past those its
            preprocessors are decoding and its masters' posted receives); 0 where its start is
            measured (`start_s`, which then holds its joins' waits).
    """

    latency_s: float = 5.0
    bandwidth: float = 1e9
    state_factor: float = 3.0
    default_param_bytes: int = 100_000_000
    planning_s: float | None = 0.0
    start_s: float = 0.0
    join_samples: float = 0.0

    def checkpoint_s(self, param_bytes: int | None) -> float:
        """Seconds to checkpoint a model of ``param_bytes`` parameter bytes."""
        size = self.default_param_bytes if param_bytes is None else param_bytes
        return self.latency_s + self.state_factor * size / self.bandwidth

    def restore_s(self, param_bytes: int | None) -> float:
        """Seconds to restore it (same path in the other direction)."""
        return self.checkpoint_s(param_bytes)


FREE = Overheads(latency_s=0.0, bandwidth=float("inf"), planning_s=0.0)
"""No overheads at all: useful for hand-checkable tests."""
