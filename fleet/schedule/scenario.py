"""What a simulated run is about: the GPUs, the models' rates, their true and estimated epochs.

A `Scenario` is everything about a run except the policy and the overhead model: the rate table
(the truth the simulator moves streams by), the epochs each model really needs (which only the
simulator sees) and what the policy is told instead, and optionally the rates the policy plans
with, decoding limits, a resumed run's progress, learning curves and data partitions.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from fleet.schedule.cores import SharedCores
from fleet.schedule.rates import RateTable


def whole_epochs(epochs: Sequence[float]) -> tuple[int, ...]:
    """Estimated epochs rounded up to whole epochs (at least one): the epochs a simulated
    model really trains when the estimates are all there is."""
    return tuple(max(1, math.ceil(e - 1e-9)) for e in epochs)



@dataclass(frozen=True)
class Cluster:
    """The GPUs a run may use: GPU ``g`` is on node ``g // gpus_per_node``."""

    total_gpus: int
    gpus_per_node: int

    @property
    def nodes(self) -> int:
        """Number of nodes (the last one may be partly used)."""
        return math.ceil(self.total_gpus / self.gpus_per_node)


@dataclass(frozen=True)
class Scenario:
    """Everything about a run except the policy and the overhead model.

    Attributes:
        rates: profiled rates (taken as the truth by the simulator, shown to the policy).
        true_epochs: epochs each model really needs; only the simulator sees them.
        epochs_estimate: what the policy is told instead.
        cluster: the GPUs.
        planning_rates: rates shown to the policy when they differ from the truth (the same
            models in the same order); None: the policy sees `rates`.
        decode_rate: samples/s all the run's preprocessors decode together, shared by the
            running streams; None: decoding keeps up with every stream.
        own_decode_rate: samples/s one trainer process decodes, for the streams decoded in
            their member's own process (their steps wait for it); None: free.
        resumed: for a run resumed from checkpoints, per model the epochs it had trained
            (fractional: a partial epoch carries over; the model starts ``PAUSED``), or None
            for one that never started (``PENDING``); empty: a fresh run.
        curves: per model, the validation metric (lower is better) after each of its epochs,
            at least ``true_epochs`` of them, reported with every epoch (the stop-rule noise
            model); empty: epochs report no metric.
        partition_sizes: training samples of each partition of partitioned data (they add up
            to the rate table's ``samples_per_epoch``); empty: whole data.
        visited: for a resumed run of partitioned data, per model the partitions visited in
            its current epoch; empty: none.
        partition_groups: with learning over groups on partitioned data, each group's shards
            (`fleet.schedule.partitions.Partitions.groups`): a model of a listed group visits
            only its group's partitions; empty: every model visits every partition.
        cores: on CPU nodes, the cores the trainers and preprocessors share and what a sample
            costs on them (`fleet.schedule.cores`); None: every trainer has its device to itself
            (GPUs) and decoding is limited by `decode_rate` only.
        lead_samples: how far (samples) a member may run ahead of its stream's slowest member,
            as the runtime's queues let it (chunks decoded and received but not yet released by
            every member); 0: a stream's members move in lockstep at the slowest one's pace.
        preprocessors_per_node: the preprocessor processes of each node, among which
            `decode_rate` is divided: a stream of whole data takes its chunks from those the
            runtime gives it (`fleet.schedule.decoders`); 0: every stream shares all of the
            decoding (the paper's model).
    """

    rates: RateTable
    true_epochs: tuple[int, ...]
    epochs_estimate: tuple[float, ...]
    cluster: Cluster
    planning_rates: RateTable | None = None
    decode_rate: float | None = None
    own_decode_rate: float | None = None
    resumed: tuple[float | None, ...] = ()
    curves: tuple[tuple[float, ...], ...] = ()
    partition_sizes: tuple[float, ...] = ()
    visited: tuple[tuple[int, ...], ...] = ()
    cores: SharedCores | None = None
    partition_groups: tuple[tuple[str, tuple[tuple[int, float], ...]], ...] = ()
    lead_samples: float = 0.0
    preprocessors_per_node: int = 0

    def __post_init__(self) -> None:
        n = len(self.rates.models)
        if self.partition_sizes and abs(sum(self.partition_sizes) - self.rates.samples_per_epoch) > 1e-6 * max(
                1.0, self.rates.samples_per_epoch):
            raise ValueError("partition_sizes must add up to the rate table's samples_per_epoch")
        if self.visited and len(self.visited) != n:
            raise ValueError("visited needs one entry per model (or none)")
        if self.planning_rates is not None and self.planning_rates.ids != self.rates.ids:
            raise ValueError("planning_rates must hold the same models as rates, in the same order")
        if len(self.true_epochs) != n or len(self.epochs_estimate) != n:
            raise ValueError("true_epochs and epochs_estimate need one entry per model")
        if any(e < 1 for e in self.true_epochs):
            raise ValueError("every model needs at least one epoch")
        if not self.lead_samples >= 0:
            raise ValueError(f"lead_samples must be >= 0, got {self.lead_samples!r}")
        for name in ("decode_rate", "own_decode_rate"):
            if getattr(self, name) is not None and not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive (or None)")
        if self.resumed and len(self.resumed) != n:
            raise ValueError("resumed needs one entry per model (or none)")
        if self.curves and (len(self.curves) != n or any(len(c) < e for c, e in zip(self.curves, self.true_epochs))):
            raise ValueError("curves needs one entry per model, each at least as long as its true epochs")
        for done, epochs in zip(self.resumed, self.true_epochs):
            if done is not None and not 0 <= done < epochs:
                raise ValueError(f"a resumed model must have trained 0 to fewer than its {epochs} epochs, not {done}")
