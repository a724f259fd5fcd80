"""What a simulated run leaves: the timeline of rounds, streams and members, and its totals."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


class Outcome(enum.Enum):
    """How a member left its stream."""

    CONVERGED = "converged"
    CHECKPOINTED = "checkpointed"
    HOPPED = "hopped"  # a visit of partitioned data ended and the model left for the next
    STOPPED = "stopped"  # early stopping ended it at a rung


@dataclass(frozen=True)
class MemberRecord:
    """One stay of a model on its GPUs.

    Attributes:
        model: model id.
        stream: stream id.
        round: round index.
        gpus: global GPU indices.
        launched: when the GPUs were reserved.
        start: when it began training (after planning and restore).
        end: when it converged or stopped for a checkpoint.
        released: when the GPUs were freed (``end``, or the end of the checkpoint).
        outcome: :class:`Outcome`.
        epochs_start: epochs done at ``start`` (fractional).
        epochs_end: epochs done at ``end`` (fractional).
    """

    model: str
    stream: int
    round: int
    gpus: tuple[int, ...]
    launched: float
    start: float
    end: float
    released: float
    outcome: Outcome
    epochs_start: float
    epochs_end: float


@dataclass(frozen=True)
class StreamRecord:
    """One shared stream: its members over its life and what it decoded."""

    id: int
    round: int
    start: float
    end: float
    members: tuple[str, ...]
    samples_decoded: float


@dataclass(frozen=True)
class RoundRecord:
    """A round: from its first launch to its last release of GPUs."""

    index: int
    start: float
    end: float


@dataclass(frozen=True)
class Timeline:
    """Everything that happened, in start order."""

    rounds: tuple[RoundRecord, ...]
    streams: tuple[StreamRecord, ...]
    members: tuple[MemberRecord, ...]


@dataclass(frozen=True)
class GpuTime:
    """GPU-seconds of a run by what the GPUs did; they add up to ``M * makespan``.

    Attributes:
        training: training at the model's own rate.
        pacing: held by a member but slowed down to the stream's slower pace.
        overhead: planning, restoring and checkpointing.
        idle: held by no model.
    """

    training: float
    pacing: float
    overhead: float
    idle: float


@dataclass(frozen=True)
class SwitchRecord:
    """``policy: auto`` handing the run to another policy, as the simulated run did it."""

    at: float
    current: str
    to: str


@dataclass(frozen=True)
class SimResult:
    """Outcome of one simulated run.

    Attributes:
        policy: policy name.
        total_gpus: ``M``.
        makespan: seconds until the last model converged.
        rounds: number of rounds.
        samples_decoded: samples decoded by all streams together.
        gpu_time: :class:`GpuTime` breakdown.
        idle_per_gpu: seconds each GPU held no model.
        planning_s: duration of each policy call that launched something.
        checkpoints: number of model checkpoints taken (hops included).
        timeline: the :class:`Timeline`.
        interrupted: the run was stopped by ``interrupt_at`` before every model converged.
        epochs_trained: per model, the (fractional) epochs it had trained at the end, those
            of the scenario's ``resumed`` included.
        hops: visits of partitioned data that ended with a hop (a checkpoint and, later, a
            restore on the next partition's nodes).
        visited: per model, the partitions visited in its current epoch at the end (an
            interrupted run of partitioned data); empty without partitions.
        switches: where the run adapted (`simulate`'s ``adapt``), each policy switch of
            ``policy: auto``.
        rates_adopted: where the run adapted, how often measured rates were adopted.
        rung_decisions: with early stopping (`simulate`'s ``early_stop``), every rung decision
            in the order it was made.
    """

    policy: str
    total_gpus: int
    makespan: float
    rounds: int
    samples_decoded: float
    gpu_time: GpuTime
    idle_per_gpu: tuple[float, ...]
    planning_s: tuple[float, ...]
    checkpoints: int
    timeline: Timeline
    interrupted: bool = False
    epochs_trained: tuple[float, ...] = ()
    hops: int = 0
    visited: tuple[tuple[int, ...], ...] = ()
    switches: tuple[SwitchRecord, ...] = ()
    rates_adopted: int = 0
    rung_decisions: tuple = ()

    @property
    def mean_gpu_wait(self) -> float:
        """Mean idle seconds per GPU."""
        return float(np.mean(self.idle_per_gpu)) if self.idle_per_gpu else 0.0


def gpu_time(
    members: Sequence[MemberRecord], slack: float, total_gpus: int, makespan: float
) -> tuple[GpuTime, tuple[float, ...]]:
    """The GPU-time breakdown of a run that ended at `makespan` and each GPU's idle seconds;
    `slack`: GPU-seconds its streams' members spent slowed to their stream's pace."""
    held = np.zeros(total_gpus)
    training = overhead = 0.0
    for r in members:
        for g in r.gpus:
            held[g] += r.released - r.launched
        training += (r.end - r.start) * len(r.gpus)
        overhead += ((r.start - r.launched) + (r.released - r.end)) * len(r.gpus)
    pacing = float(slack)
    idle = np.maximum(makespan - held, 0.0)
    breakdown = GpuTime(training - pacing, pacing, overhead, float(idle.sum()))
    return breakdown, tuple(float(x) for x in idle)
