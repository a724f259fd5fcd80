"""Where the GPUs' time went in a run, over time and in total (pure; from a `RunStory`).

Each stint's GPUs are, in turn: **training** (computing), **waiting for data**,
**checkpointing** and **other** (start-up, evaluation, regrouping: the stint's time outside its
epochs and saves); a GPU held by no stint while a job runs is **idle**. The log records each
epoch's wall time and the group's compute and consumption rates, not when inside the epoch it
waited, so an epoch's training and waiting are spread evenly over it; a save is placed right
after the epoch it followed (the last one at the stint's end). Time between a job and its
resume is not on the story's clock.
"""

from __future__ import annotations

from dataclasses import dataclass

from fleet.report.run_story import RunStory, Stint

CATEGORIES = ("training", "waiting for data", "checkpointing", "other", "idle")


@dataclass(frozen=True)
class Piece:
    """`share` of each of the stint's GPUs did `category` from `start` to `end`."""

    start: float
    end: float
    category: str
    share: float = 1.0


def stint_pieces(stint: Stint) -> list[Piece]:
    """The stint's time split into categories; the pieces cover it exactly."""
    pieces: list[Piece] = []
    for epoch in stint.epochs:
        start = max(stint.start, epoch.end - epoch.wall_s)
        end = min(max(epoch.end, start), stint.end)
        if end > start:
            pieces.append(Piece(start, end, "training", epoch.compute_share))
            pieces.append(Piece(start, end, "waiting for data", 1.0 - epoch.compute_share))
        saved = min(end + epoch.checkpoint_s, stint.end)
        if saved > end:
            pieces.append(Piece(end, saved, "checkpointing"))
    if stint.final_checkpoint_s > 0:
        pieces.append(Piece(max(stint.start, stint.end - stint.final_checkpoint_s), stint.end, "checkpointing"))
    return pieces + _uncovered(stint, pieces)


def _uncovered(stint: Stint, pieces: list[Piece]) -> list[Piece]:
    """`other`: the parts of the stint no piece covers (overlaps counted once)."""
    spans = sorted((p.start, p.end) for p in pieces)
    out, cursor = [], stint.start
    for start, end in spans:
        if start > cursor:
            out.append(Piece(cursor, min(start, stint.end), "other"))
        cursor = max(cursor, end)
    if stint.end > cursor:
        out.append(Piece(cursor, stint.end, "other"))
    return out


def _trimmed(pieces: list[Piece]) -> list[Piece]:
    """Pieces cut where a later one (a save placed after an epoch) overlaps an earlier one,
    so that a GPU's shares never add up to more than 1 at any time."""
    saves = _merged([p for p in pieces if p.category == "checkpointing"])
    out = [p for p in pieces if p.category == "other"] + saves
    for piece in pieces:
        if piece.category in ("training", "waiting for data"):
            out += [Piece(a, b, piece.category, piece.share) for a, b in _minus(piece.start, piece.end, saves)]
    return out


def _merged(saves: list[Piece]) -> list[Piece]:
    out: list[Piece] = []
    for save in sorted(saves, key=lambda p: p.start):
        if out and save.start <= out[-1].end:
            out[-1] = Piece(out[-1].start, max(out[-1].end, save.end), save.category)
        else:
            out.append(save)
    return out


def _minus(start: float, end: float, holes: list[Piece]) -> list[tuple[float, float]]:
    parts = [(start, end)]
    for hole in holes:
        parts = [q for a, b in parts for q in ((a, min(b, hole.start)), (max(a, hole.end), b)) if q[1] > q[0]]
    return parts


def gpu_seconds(story: RunStory) -> dict[str, float]:
    """GPU-seconds per category over the jobs' time (idle: held by no stint)."""
    totals = dict.fromkeys(CATEGORIES, 0.0)
    for stint in story.stints:
        for piece in _trimmed(stint_pieces(stint)):
            totals[piece.category] += (piece.end - piece.start) * piece.share * len(stint.gpus)
    held = sum(v for k, v in totals.items() if k != "idle")
    totals["idle"] = max(0.0, story.gpus * story.training_s - held)
    return totals


def gpu_use_over_time(story: RunStory, bins: int = 200) -> tuple[list[float], dict[str, list[float]]]:
    """(bin centres in seconds, GPUs busy with each category in each bin on average)."""
    end = max(story.end, 1e-9)
    width = end / bins
    centres = [(k + 0.5) * width for k in range(bins)]
    series = {category: [0.0] * bins for category in CATEGORIES}
    for stint in story.stints:
        for piece in _trimmed(stint_pieces(stint)):
            _spread(series[piece.category], piece.start, piece.end, piece.share * len(stint.gpus), width)
    running = [0.0] * bins
    for job in story.jobs:
        _spread(running, job.start, job.end, story.gpus, width)
    held = [sum(series[c][k] for c in CATEGORIES if c != "idle") for k in range(bins)]
    series["idle"] = [max(0.0, running[k] - held[k]) for k in range(bins)]
    return centres, series


def _spread(values: list[float], start: float, end: float, amount: float, width: float) -> None:
    """Add `amount` to each bin in proportion to the part of the bin [start, end) covers."""
    if end <= start:
        return
    first, last = int(start // width), min(int(end // width), len(values) - 1)
    for k in range(max(first, 0), last + 1):
        overlap = min(end, (k + 1) * width) - max(start, k * width)
        if overlap > 0:
            values[k] += amount * overlap / width
