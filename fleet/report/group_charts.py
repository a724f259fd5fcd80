"""The PNG of learning over groups in `fleet report`: each group's best metric against its
size, coloured by the configuration that did best there; matplotlib on the Agg backend."""

from __future__ import annotations

from collections.abc import Sequence

from fleet.report._figures import pyplot, save_png
from fleet.report.group_results import GroupResult

NAMED_CONFIGURATIONS = 10  # configurations the legend names (those best in most groups); the rest grey
LOG_SIZES = 20.0  # sizes spread wider than this ratio go on a log axis


def _colors(plt, drawn: Sequence[GroupResult]) -> dict[str, object]:
    """A colour per configuration best in the most groups; the others grey."""
    wins: dict[str, int] = {}
    for g in drawn:
        wins[g.best_configuration] = wins.get(g.best_configuration, 0) + 1
    named = sorted(wins, key=lambda c: (-wins[c], c))[:NAMED_CONFIGURATIONS]
    cmap = plt.get_cmap("tab10")
    return {c: cmap(k % 10) for k, c in enumerate(named)}


def write_group_chart(groups: Sequence[GroupResult], path: str) -> None:
    """One point per group that has a best metric: its training samples (x) and its best
    model's best metric (y), coloured by that model's configuration."""
    plt = pyplot()
    drawn = [g for g in groups if g.best is not None and g.samples is not None]
    fig, ax = plt.subplots(figsize=(10, 4.2))
    colors = _colors(plt, drawn)
    for configuration, color in colors.items():
        mine = [g for g in drawn if g.best_configuration == configuration]
        ax.scatter([g.samples for g in mine], [g.best.best_metric for g in mine], color=color, s=22,
                   label=configuration)
    others = [g for g in drawn if g.best_configuration not in colors]
    if others:
        ax.scatter([g.samples for g in others], [g.best.best_metric for g in others], color="#bbbbbb", s=18,
                   label="other configurations")
    sizes = [g.samples for g in drawn]
    if sizes and max(sizes) > LOG_SIZES * max(min(sizes), 1):
        ax.set_xscale("log")
    if not drawn:
        ax.text(0.5, 0.5, "no group has a best metric yet", transform=ax.transAxes, ha="center", va="center")
    else:
        ax.legend(fontsize=8, title="best configuration", loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_xlabel("group size: training samples of one epoch")
    ax.set_ylabel(" / ".join(sorted({g.best.metric for g in drawn})) or "best metric")
    ax.grid(alpha=0.3)
    left = len(groups) - len(drawn)
    ax.set_title(f"best metric of each group against its size: {len(drawn)} group(s)"
                 + (f" ({left} without a finished epoch left out)" if left else ""), fontsize=9)
    fig.tight_layout()
    save_png(fig, path)
