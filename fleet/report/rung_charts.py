"""The PNGs of early stopping in `fleet report`: models per rung over time, and the learning
curves with a mark where each stopped model was stopped; matplotlib on the Agg backend."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from fleet.report._figures import pyplot, save_png
from fleet.report.results import ModelResult, stopped_early

TRAINED_ON, STOPPED = "#4c72b0", "#c44e52"


def write_rung_chart(arrivals: Mapping[int, Sequence[float]], path: str) -> None:
    """A step line per rung: the models that had reached it by each time (`rung_arrivals`)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(10, 3.8))
    last = max((t for times in arrivals.values() for t in times), default=0.0)
    for rung, times in arrivals.items():
        counts = list(range(len(times) + 1))
        ax.step([0.0, *times, last], [*counts, len(times)], where="post", label=f"rung at epoch {rung}")
    if not arrivals:
        ax.text(0.5, 0.5, "no rung decided yet", transform=ax.transAxes, ha="center", va="center")
    ax.yaxis.get_major_locator().set_params(integer=True)
    ax.set_xlabel("seconds since the run's start")
    ax.set_ylabel("models that reached the rung")
    ax.grid(alpha=0.3)
    ax.set_title("early stopping: models per rung over time (from the rung decisions)", fontsize=9)
    if arrivals:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    save_png(fig, path)


def write_stopped_curves(models: Sequence[ModelResult], path: str) -> None:
    """Validation accuracy per epoch, every model one line; a model stopped by early stopping
    drawn red, with an x at the epoch where it was stopped."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(10, 4.2))
    for model in models:
        epochs = [e["epoch"] for e in model.history]
        accuracy = [e.get("val_accuracy") for e in model.history]
        stopped = stopped_early(model)
        ax.plot(epochs, accuracy, color=STOPPED if stopped else TRAINED_ON, alpha=0.6 if stopped else 0.9, linewidth=1)
        if stopped and epochs and accuracy[-1] is not None:
            ax.plot([epochs[-1]], [accuracy[-1]], "x", color="black", markersize=7)
    ax.plot([], [], color=TRAINED_ON, label="trained on")
    ax.plot([], [], color=STOPPED, label="stopped by early stopping")
    ax.plot([], [], "x", color="black", label="where it was stopped")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_xlabel("epoch")
    ax.set_ylabel("val_accuracy")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("learning curves with early stopping's stops", fontsize=9)
    fig.tight_layout()
    save_png(fig, path)
