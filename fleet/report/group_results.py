"""Results per group (learning over groups, `data.group_by`), from the models' results (pure).

Every (group, configuration) is a model of its own; what a user asks of a grouped run is, per
group, which configuration did best there and whether the group is done. `by_group` answers it
from the same `ModelResult` rows the leaderboard ranks: each group's models ranked among
themselves (never across groups: they learn different data), its best configuration, how
many of its models ended, and its size, the training and validation samples one epoch of its
models saw (every epoch record has them; None before any of its models finished an epoch).
Groups come largest first, so the groups that weigh most lead a long listing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fleet.report.table import format_table
from preprocess.grouped import configuration_ids

if TYPE_CHECKING:  # annotations only: fleet.report.results ranks the models and calls `by_group`
    from fleet.report.results import ModelResult


@dataclass(frozen=True)
class GroupResult:
    """One group's models and how they did.

    Attributes:
        key: the group's raw key.
        ranked: its models, best first (by each one's best metric; those without one last).
        configurations: each ranked model's configuration id, in the same order.
        samples: training samples in one epoch of the group (None: no epoch finished yet).
        val_samples: its validation samples (None likewise).
    """

    key: str
    ranked: tuple[ModelResult, ...]
    configurations: tuple[str, ...]
    samples: int | None
    val_samples: int | None

    @property
    def best(self) -> ModelResult | None:
        """The group's best model so far (None: none has a metric yet)."""
        first = self.ranked[0] if self.ranked else None
        return first if first is not None and first.best_metric is not None else None

    @property
    def best_configuration(self) -> str | None:
        return self.configurations[0] if self.best is not None else None

    @property
    def ended(self) -> int:
        """Its models that ended (their stop rule, early stopping, or diverged)."""
        return sum(m.converged for m in self.ranked)

    @property
    def done(self) -> bool:
        """Every model of the group ended."""
        return self.ended == len(self.ranked)

    def record(self) -> dict:
        """The group's entry in results.json's ``group_results``."""
        best = self.best
        return {
            "key": self.key, "samples": self.samples, "val_samples": self.val_samples,
            "models": [m.id for m in self.ranked], "configurations": list(self.configurations),
            "best": None if best is None else {
                "model": best.id, "configuration": self.best_configuration, "metric": best.metric,
                "value": best.best_metric, "epoch": best.best_epoch},
            "ended": self.ended, "done": self.done,
        }


def _epoch_size(models: Iterable[ModelResult], field: str) -> int | None:
    sizes = [int(e[field]) for m in models for e in m.history if isinstance(e.get(field), int)]
    return max(sizes) if sizes else None


def by_group(ranked: Sequence[ModelResult], groups: Mapping[str, str]) -> list[GroupResult]:
    """Each group of `groups` (model id -> its group's raw key) with its models of `ranked`
    (every model, best first: `fleet.report.results.leaderboard_rows`, which keeps that order
    within each group), the largest group first (unknown sizes last; ties by key); [] without
    groups. `fleet.report.results.group_results` ranks and calls it."""
    configurations = configuration_ids(groups)
    members: dict[str, list[ModelResult]] = {}
    for model in ranked:
        if model.id in groups:
            members.setdefault(groups[model.id], []).append(model)
    out = []
    for key, theirs in members.items():
        out.append(GroupResult(key, tuple(theirs), tuple(configurations[m.id] for m in theirs),
                               _epoch_size(theirs, "samples"), _epoch_size(theirs, "val_samples")))
    return sorted(out, key=lambda g: (g.samples is None, -(g.samples or 0), g.key))


def group_ranks(groups: Sequence[GroupResult]) -> dict[str, int]:
    """Each model's rank within its group (1: its group's best)."""
    return {m.id: rank for g in groups for rank, m in enumerate(g.ranked, start=1)}


SHOWN_GROUPS = 20
"""Groups the console lists at the end of a run (the largest); the rest are in results.json."""


def group_table(groups: Sequence[GroupResult], limit: int | None = SHOWN_GROUPS) -> list[str]:
    """One line per group, the largest first: its samples, its best model and configuration,
    the best metric and its epoch, and its models ended; at most `limit` groups (None: all),
    then a line saying how many more there are."""
    rows = []
    for g in groups[:limit]:
        best = g.best
        rows.append((g.key, "-" if g.samples is None else g.samples, best.id if best else "-",
                     g.best_configuration or "-", f"{best.metric} {best.best_metric:.4f}" if best else "-",
                     best.best_epoch if best else "-", f"{g.ended}/{len(g.ranked)}"))
    lines = format_table(("group", "samples", "best model", "configuration", "best", "at epoch", "ended"),
                         rows).splitlines()
    if limit is not None and len(groups) > limit:
        lines.append(f"... and {len(groups) - limit} smaller group(s)")
    return lines
