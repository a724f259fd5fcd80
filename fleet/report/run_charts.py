"""The PNGs of `fleet report`: learning curves, the real Gantt of a run, GPU use over time,
and decoded samples against a per-model pipeline. Each writer takes what `run_story`,
`gpu_use` and `standings` computed and draws it; matplotlib on the Agg backend."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from fleet.report._figures import pyplot, save_png
from fleet.report.gantt import gpu_ticks
from fleet.report.gpu_use import CATEGORIES, gpu_use_over_time
from fleet.report.results import ModelResult, leaderboard_rows
from fleet.report.run_story import RunStory, Stint

NAMED_PER_FAMILY = 10  # models a family's legend names (its best), the rest drawn grey
USE_COLORS = {"training": "#4c72b0", "waiting for data": "#dd8452", "checkpointing": "#c44e52",
              "other": "#8172b3", "idle": "#cccccc"}


def _family_colors(plt, models: Sequence[ModelResult]) -> dict[str, object]:
    cmap = plt.get_cmap("tab10")
    return {family: cmap(k % 10) for k, family in enumerate(dict.fromkeys(m.family for m in models))}


def write_curves(models: Sequence[ModelResult], path: str) -> None:
    """Train loss and the validation metric per epoch, every model one line, coloured by family."""
    plt = pyplot()
    colors = _family_colors(plt, models)
    fig, (loss_ax, metric_ax) = plt.subplots(1, 2, figsize=(12, 4.2))
    for model in models:
        epochs = [e["epoch"] for e in model.history]
        loss_ax.plot(epochs, [e.get("train_loss") for e in model.history], color=colors[model.family], alpha=0.8)
        metric_ax.plot(epochs, [e.get(model.metric) for e in model.history], color=colors[model.family], alpha=0.8)
    for family, color in colors.items():
        metric_ax.plot([], [], color=color, label=family)
    _label(loss_ax, "train loss", "epoch")
    _label(metric_ax, " / ".join(sorted({m.metric for m in models})) or "val_accuracy", "epoch")
    metric_ax.legend(fontsize=8, title="family")
    fig.suptitle("learning curves: every model, coloured by family")
    fig.tight_layout()
    save_png(fig, path)


def write_family_curves(models: Sequence[ModelResult], path: str) -> None:
    """One column per family: its models' train loss (top) and validation metric (bottom); the
    legend names the family's `NAMED_PER_FAMILY` best models (a longer one is unreadable), drawn
    over the others."""
    plt = pyplot()
    families = list(dict.fromkeys(m.family for m in models)) or ["-"]
    fig, axes = plt.subplots(2, len(families), figsize=(max(4.0 * len(families), 6), 6.5), squeeze=False)
    for column, family in enumerate(families):
        ranked = leaderboard_rows([m for m in models if m.family == family])
        named = ranked[:NAMED_PER_FAMILY]
        named_ids = {m.id for m in named}
        for model in reversed(ranked):  # the best drawn last, on top
            epochs = [e["epoch"] for e in model.history]
            style = {"marker": ".", "label": model.id} if model.id in named_ids else {"color": "#bbbbbb", "linewidth": 0.8}
            axes[0][column].plot(epochs, [e.get("train_loss") for e in model.history], **style)
            axes[1][column].plot(epochs, [e.get(model.metric) for e in model.history], **style)
        shown = f"{family}: the {len(named)} best of {len(ranked)} named" if len(ranked) > len(named) else family
        axes[0][column].set_title(shown)
        _label(axes[0][column], "train loss", "")
        axes[0][column].xaxis.get_major_locator().set_params(integer=True)
        _label(axes[1][column], "validation metric", "epoch")
        handles, labels = axes[1][column].get_legend_handles_labels()
        axes[1][column].legend(handles[::-1], labels[::-1], fontsize=7)  # the best first
    fig.tight_layout()
    save_png(fig, path)


def _label(ax, ylabel: str, xlabel: str) -> None:
    if xlabel == "epoch":
        ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_ylabel(ylabel)
    ax.set_xlabel(xlabel)
    ax.grid(alpha=0.3)


def write_run_gantt(story: RunStory, path: str, gpus_per_node: int, slot: str = "GPU") -> None:
    """One row per GPU, one bar per stint coloured by stream (hatched: left checkpointed, not
    converged); rounds dashed, checkpoints and regroups marked, each resume a red line."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(12, max(2.5, 0.35 * story.gpus + 1.6)))
    draw_run(ax, story, gpus_per_node, slot)
    ax.set_title(f"what ran where: {len(story.stints)} stints, {len(story.rounds)} rounds; colour: stream; "
                 "hatched: left checkpointed; v: checkpoint, x: regroup", fontsize=9)
    fig.tight_layout()
    save_png(fig, path)


def draw_run(ax, story: RunStory, gpus_per_node: int, slot: str = "GPU", colors: Mapping[str, object] | None = None,
             end: float | None = None) -> None:
    """The story's stints on `ax`, one row per GPU, coloured by stream (or by model, with
    `colors`), with its marks; the time axis to `end` (default: the story's)."""
    cmap = pyplot().get_cmap("tab20")
    end = max(end or story.end, 1e-9)
    for stint in story.stints:
        color = colors[stint.model] if colors is not None else cmap((stint.stream or 0) % 20)
        width = stint.end - stint.start
        for gpu in stint.gpus:
            ax.barh(gpu, width, left=stint.start, height=0.8, color=color, edgecolor="white", linewidth=0.5,
                    hatch=None if stint.outcome == "converged" else "//")
        if width > 0.04 * end and stint.gpus:
            ax.text(stint.start + width / 2, sum(stint.gpus) / len(stint.gpus), stint.model, ha="center",
                    va="center", fontsize=7)
    _marks(ax, story)
    for start in story.rounds[1:]:
        ax.axvline(start, color="black", linestyle="--", linewidth=0.8)
    for job in story.jobs[1:]:
        ax.axvline(job.start, color="#b00000", linewidth=1.5)
        ax.text(job.start, -0.45, " resumed", fontsize=7, va="top", color="#b00000")
    for boundary in range(gpus_per_node, story.gpus, max(gpus_per_node, 1)):
        ax.axhline(boundary - 0.5, color="grey", linewidth=0.6)
    positions, labels = gpu_ticks(story.gpus, gpus_per_node)
    ax.set_yticks(positions, [label.replace("GPU", slot) for label in labels])
    ax.set_ylim(story.gpus - 0.5, -0.5)
    ax.set_xlim(0, end * 1.01)
    ax.set_xlabel("seconds of the run's jobs (measured; the wait before a resume left out)")
    ax.legend(handles=_mark_legend(ax), fontsize=7, loc="lower right")


def _holding(story: RunStory, at: float, model: str | None = None, stream: int | None = None) -> list[Stint]:
    return [s for s in story.stints if s.start <= at <= s.end and (model is None or s.model == model)
            and (stream is None or s.stream == stream)]


def _marks(ax, story: RunStory) -> None:
    for at, model in story.checkpoints:
        for stint in _holding(story, at, model=model):
            ax.plot([at] * len(stint.gpus), stint.gpus, "v", color="black", markersize=5)
    for at, stream in story.regroups:
        gpus = [g for stint in _holding(story, at, stream=stream) for g in stint.gpus]
        ax.plot([at] * len(gpus), gpus, "x", color="#b00000", markersize=5)


def _mark_legend(ax) -> list:
    return [ax.plot([], [], "v", color="black", label="checkpoint")[0],
            ax.plot([], [], "x", color="#b00000", label="regroup")[0]]


def write_gpu_use(story: RunStory, path: str, slot: str = "GPU") -> None:
    """GPUs training, waiting for data, checkpointing, doing other work and idle, over time."""
    plt = pyplot()
    centres, series = gpu_use_over_time(story)
    fig, ax = plt.subplots(figsize=(12, 3.8))
    ax.stackplot(centres, *(series[c] for c in CATEGORIES), labels=CATEGORIES,
                 colors=[USE_COLORS[c] for c in CATEGORIES])
    ax.set_xlim(0, max(story.end, 1e-9))
    ax.set_ylim(0, story.gpus * 1.02)
    _label(ax, f"{slot}s", "seconds of the run's jobs")
    ax.set_title(f"{slot} use over time (an epoch's training and waiting spread evenly over it)", fontsize=9)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    save_png(fig, path)


def write_decoded(decoded: int, per_model: int, path: str) -> None:
    """Training samples fleet's preprocessors decoded against what one pipeline per model would."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.2))
    bars = ax.barh([0, 1], [per_model, decoded], color=["#bbbbbb", "#4c72b0"])
    ax.set_yticks([0, 1], ["a pipeline per model", "fleet (shared streams)"])
    for bar, value in zip(bars, (per_model, decoded)):
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {value:,}", va="center", fontsize=8)
    ax.set_xlim(0, max(per_model, decoded, 1) * 1.25)
    ax.set_xlabel("training samples decoded")
    ratio = f"{per_model / decoded:.1f}x fewer" if decoded else "nothing decoded yet"
    ax.set_title(f"decoding: fleet decoded {ratio} than a pipeline per model would", fontsize=9)
    fig.tight_layout()
    save_png(fig, path)


def write_note(text: str, path: str) -> None:
    """A small image saying why a chart is missing."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 1.6))
    ax.axis("off")
    ax.text(0.5, 0.5, text, ha="center", va="center")
    save_png(fig, path)
