"""A Gantt chart of a plan: one row per GPU, one bar per model while it holds the GPU.

Input is a ``plan.json`` dict as `fleet.schedule_io.plan_document` writes it (members with
``gpus``, ``start``, ``end`` and ``outcome``); rounds are marked by dashed lines.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from fleet.report._figures import pyplot, save_png


def write_gantt(plan: dict, path: str, title: str = "") -> None:
    """Write the chart to `path` (PNG).

    Raises:
        UserError: the file cannot be written.
    """
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(12, max(2.5, 0.35 * plan["total_gpus"] + 1.2)))
    draw_plan(ax, plan, model_colors(plt, [m["model"] for rnd in plan["rounds"] for m in rnd["members"]]))
    ax.set_title(title or f"{plan['policy']}: predicted makespan {plan['makespan_s']:,.0f} s; "
                 "hatched: checkpointed, not yet converged")
    fig.tight_layout()
    save_png(fig, path)


def model_colors(plt, models: Iterable[str]) -> dict[str, object]:
    """A colour per model, in order of first appearance (tab20, round and round)."""
    cmap = plt.get_cmap("tab20")
    return {model: cmap(k % 20) for k, model in enumerate(dict.fromkeys(models))}


def draw_plan(ax, plan: dict, colors: Mapping[str, object], end: float | None = None, slot: str = "GPU") -> None:
    """The plan's members on `ax`, one row per GPU (`slot`s on a CPU), coloured by `colors`
    (a model); the time axis to `end` (default: the last member's end)."""
    gpus = plan["total_gpus"]
    members = [m for rnd in plan["rounds"] for m in rnd["members"]]
    end = end or max((m["end"] for m in members), default=1.0)
    for member in members:
        width = member["end"] - member["start"]
        for gpu in member["gpus"]:
            ax.barh(gpu, width, left=member["start"], height=0.8, color=colors[member["model"]],
                    edgecolor="white", linewidth=0.5, hatch="//" if member["outcome"] != "converged" else None)
        if width > 0.04 * end:
            middle = sum(member["gpus"]) / len(member["gpus"])
            ax.text(member["start"] + width / 2, middle, member["model"], ha="center", va="center", fontsize=7)
    for rnd in plan["rounds"][1:]:
        ax.axvline(rnd["start"], color="black", linestyle="--", linewidth=0.8)
    gpn = plan["gpus_per_node"]
    for boundary in range(gpn, gpus, gpn):
        ax.axhline(boundary - 0.5, color="grey", linewidth=0.6)
    ax.set_ylim(gpus - 0.5, -0.5)
    positions, labels = gpu_ticks(gpus, gpn)
    named = [label.replace("GPU", slot) for label in labels]
    ax.set_yticks(positions, named, fontsize=7 if len(positions) > 16 else None)
    ax.set_xlim(0, end * 1.01)
    ax.set_xlabel("seconds (predicted)")
    one_node = gpus <= gpn
    ax.set_ylabel(f"{slot} ({gpn} per node)" if len(positions) < gpus else (slot if one_node else f"node / {slot}"))


MAX_TICKS = 48


def gpu_ticks(gpus: int, per_node: int) -> tuple[list[int], list[str]]:
    """The rows the chart names and their names: every GPU (``n0 g1``, or ``GPU 1`` on one
    node) while that makes at most `MAX_TICKS`, else the first GPU of every node (``node 3``),
    or of every k-th node where even those would be too many."""
    per_node = max(per_node, 1)
    nodes = -(-gpus // per_node)
    if gpus <= MAX_TICKS:
        if nodes == 1:
            return list(range(gpus)), [f"GPU {g}" for g in range(gpus)]
        return list(range(gpus)), [f"n{g // per_node} g{g % per_node}" for g in range(gpus)]
    step = -(-nodes // MAX_TICKS)
    shown = range(0, nodes, step)
    return [n * per_node for n in shown], [f"node {n}" for n in shown]
