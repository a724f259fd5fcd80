"""The visit log of partitioned data: ``visits.jsonl`` in the run directory.

One line per visit that ended (a model's pass over one partition): ``model``, ``epoch`` (the
model's epoch the visit belongs to, from 1), ``partition``, ``gpus``, ``start`` and ``end``
(seconds on the job's clock), ``job`` (which start of the run: 0, then one more per resume).
The checkpoint a visit ends with is the truth about what a model visited (a resumed job
continues from it), so a visit's line is appended only once that checkpoint is committed (its
group's leave report comes after the save), never when the pass ends: a kill in between
leaves no line for a visit the resumed model trains again. A visit whose checkpoint was
committed but whose line was lost to a kill is written on resume with ``"recovered": true``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from fleet.runtime.events import read_events
from fleet.schedule import ModelState
from fleet.schedule.ledger import Ledger, visit_parts

VISITS = "visits.jsonl"


def read_visits(run_dir: str | Path) -> list[dict]:
    """The visit log's lines, oldest first (none when there is no log; a line torn by a kill
    is skipped: its visit's checkpoint says it happened, and `VisitLog.recover` rewrites it)."""
    return [line for line in read_events(Path(run_dir) / VISITS) if {"model", "epoch", "partition"} <= line.keys()]


class VisitLog:
    """Appends the visits of one job to the run directory's log.

    Args:
        run_dir: the run directory.
    """

    def __init__(self, run_dir: str | Path):
        self.path = Path(run_dir) / VISITS
        if self.path.is_file() and not self.path.read_bytes().endswith(b"\n") and self.path.stat().st_size:
            with open(self.path, "a", encoding="utf-8") as out:  # a line torn by a kill: the next starts afresh
                out.write("\n")
        lines = read_visits(run_dir)
        self.job = 1 + max((line.get("job", 0) for line in lines), default=-1)
        self.logged = {(line["model"], line["epoch"], line["partition"]) for line in lines}
        self.open: dict[str, tuple[int, list[int], float]] = {}  # model -> (partition, gpus, start)
        self.saving: dict[str, dict] = {}  # model -> the line of its ended visit, until its checkpoint commits

    def started(self, model: str, partition: int, gpus: list[int], at: float) -> None:
        self.open[model] = (partition, gpus, at)

    def ended(self, model: str, epoch: int, at: float) -> int:
        """The pass of the visit `model` had started (in its epoch `epoch`) is over at `at`; its
        line waits for the checkpoint that records it (`left`). Returns its partition."""
        partition, gpus, start = self.open.pop(model)
        self.saving[model] = {"model": model, "epoch": epoch, "partition": partition, "gpus": gpus,
                              "start": round(start, 3), "end": round(at, 3), "job": self.job}
        return partition

    def left(self, model: str, visited: int | None, epoch: int, at: float) -> None:
        """The group of `model` left, having saved the checkpoint that records its visit: log
        the visit. `visited` is None for a visit cut short (the checkpoint signal), which is no
        visit; a visit not said to end before (the model converged on it, and its epoch's save
        recorded it) ends now, at `at` in `epoch`."""
        if visited is None:
            self.open.pop(model, None)
            return
        if model not in self.saving:
            self.ended(model, epoch, at)
        self._write(self.saving.pop(model))

    def recover(self, partitions: Mapping[str, Sequence[int]], epochs_done: Mapping[str, int],
                visited: Mapping[str, tuple[int, ...]]) -> None:
        """Write the visits the checkpoints hold and the log lacks (a kill between the two): those
        of each model's current epoch, and the last one of the epoch its checkpoint ended.
        `partitions`: the partitions each model visits an epoch (every one, or with learning
        over groups its group's)."""
        for model, done in epochs_done.items():
            parts = partitions.get(model, ())
            current = [(done + 1, k) for k in visited.get(model, ())]
            logged_last = {k for (m, e, k) in self.logged if m == model and e == done}
            last = [(done, k) for k in parts if k not in logged_last] if done and len(logged_last) == \
                len(parts) - 1 else []
            for epoch, partition in current + last:
                if (model, epoch, partition) not in self.logged:
                    self._write({"model": model, "epoch": epoch, "partition": partition, "job": self.job,
                                 "recovered": True})

    def _write(self, line: dict) -> None:
        self.logged.add((line["model"], line["epoch"], line["partition"]))
        with open(self.path, "a", encoding="utf-8") as out:
            out.write(json.dumps(line) + "\n")
            out.flush()


def recover_visits(log: VisitLog, ledger: Ledger) -> None:
    """`VisitLog.recover` of a resumed job: the visits the checkpoints of its paused models
    hold and `log` lacks, each model's partitions its group's (`visit_parts`)."""
    paused = ledger.ids_in(ModelState.PAUSED)
    log.recover({m: visit_parts(ledger.partitions, ledger.rates, m) for m in paused},
                {m: ledger.model(m).epochs_done for m in paused}, {m: ledger.model(m).visited for m in paused})
