"""Charts of a policy comparison, in the style of the FLEET paper's Figures 5 and 6.

Input is the summary of :func:`fleet.schedule.compare.summarize` (one dict per GPU count
and policy). The PNG has three panels: speedup over Baseline vs GPU count (Fig. 5a),
speedup over Homogeneous vs GPU count (Fig. 5b), and where the GPU time went at the largest
GPU count (Fig. 6-like: useful training, pacing slack, checkpoint/restore/planning, idle).
"""

from __future__ import annotations

from collections.abc import Sequence

from fleet.report._figures import pyplot, save_png

_COLORS = {"training": "#4c72b0", "pacing": "#dd8452", "overhead": "#c44e52", "idle": "#bbbbbb"}


def write_schedule_charts(summary: Sequence[dict], path: str, title: str = "") -> None:
    """Write the three-panel PNG to ``path``.

    Raises:
        UserError: the file cannot be written.
    """
    plt = pyplot()

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    _speedup_panel(axes[0], summary, "speedup_baseline", "speedup over Baseline")
    _speedup_panel(axes[1], summary, "speedup_homogeneous", "speedup over Homogeneous")
    _breakdown_panel(axes[2], summary)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    save_png(fig, path, "--chart: ")


def _speedup_panel(ax, summary: Sequence[dict], key: str, label: str) -> None:
    for policy in dict.fromkeys(s["policy"] for s in summary):
        points = sorted((s["gpus"], s[key]) for s in summary if s["policy"] == policy)
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=policy)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xlabel("GPUs")
    ax.set_ylabel(label)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def _breakdown_panel(ax, summary: Sequence[dict]) -> None:
    largest = max(s["gpus"] for s in summary)
    rows = [s for s in summary if s["gpus"] == largest]
    bottoms = [0.0] * len(rows)
    for kind, color in _COLORS.items():
        hours = [s["gpu_time"][kind] / 3600 for s in rows]
        ax.bar(range(len(rows)), hours, bottom=bottoms, color=color, label=kind)
        bottoms = [b + h for b, h in zip(bottoms, hours)]
    ax.set_xticks(range(len(rows)), [s["policy"] for s in rows], rotation=20, fontsize=8)
    ax.set_ylabel(f"GPU-hours on {largest} GPUs")
    ax.legend(fontsize=8)
