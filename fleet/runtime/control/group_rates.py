"""Rates of models of groups in the planners' unit: epoch-equivalent samples per second.

The planners, the ledger and the forecasts count a model's epoch as `RateTable.samples_per_epoch`
(N, the whole data's training samples), and a model of one group (`data.group_by`) trains an
epoch of its group's n_g samples. Its rates times N / n_g (its *epoch scale*) make an epoch
last what it lasts: n_g / r. The profile's and a run's measured rates stay in real samples/s;
the coordinator scales each measured rate the same way before the driver sees it.
"""

from __future__ import annotations

from collections.abc import Mapping

from fleet.schedule import RateTable
from fleet.schedule.rates import ModelProfile


def epoch_equivalent(table: RateTable, scales: Mapping[str, float]) -> RateTable:
    """`table` with each model's rates times its epoch scale (`scales`; 1 for a model not in it)."""
    if not scales:
        return table
    models = tuple(
        ModelProfile(p.id, tuple(r * scales.get(p.id, 1.0) for r in p.rates), p.epochs, p.param_bytes, p.extra)
        for p in table.models
    )
    return RateTable(models, table.gpus_per_node, table.samples_per_epoch, table.extra)
