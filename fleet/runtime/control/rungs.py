"""Early stopping's records in the run directory, and a resumed run's early stopping.

`early_stop.json` holds the run's setting (a resumed run must ask for the same one);
`rungs.jsonl` a line per rung decision, appended and synced before the decision acts, so a
requeued or killed job continues from the very decisions it made (`RungLog`). On resume,
`resume_early_stopping` rebuilds the run's `EarlyStopping` from them and from the models'
checkpoints: which models early stopping stopped (they count as ended), which wait at a rung
(``HELD``), and the decisions due that the records lack.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from fleet.atomic import atomic_write_json
from fleet.errors import UserError
from fleet.schedule.early_stop import (
    EarlyStopping,
    EarlyStopSettings,
    RecordError,
    RungDecision,
    create_early_stopping,
)

SETTING_FILE = "early_stop.json"
RUNG_FILE = "rungs.jsonl"


def lower_is_better(record: Mapping, metric: str) -> float | None:
    """An epoch's stop-rule metric as early stopping compares it (``-val_accuracy``, ``val_loss``)."""
    value = record.get(metric)
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return -float(value) if metric == "val_accuracy" else float(value)


class RungLog:
    """The run directory's early-stopping records; see the module docstring.

    Args:
        run_dir: the run directory.
        early: the run's early stopping (its rungs give each record its rung's index).
    """

    def __init__(self, run_dir: str | os.PathLike, early: EarlyStopping):
        self.path = Path(run_dir) / RUNG_FILE
        self.early = early

    @staticmethod
    def check_setting(run_dir: str | os.PathLike, settings: EarlyStopSettings) -> None:
        """Keep the run's setting; a resumed run must ask for the one recorded.

        Raises:
            UserError: the recorded setting differs (one line naming both).
        """
        if not check_recorded_setting(run_dir, settings):
            atomic_write_json(Path(run_dir) / SETTING_FILE, asdict(settings))

    def read(self) -> list[RungDecision]:
        """The decisions recorded so far. A last line cut off by a crash mid-write is left out
        (it was never synced, so its decision never acted).

        Raises:
            UserError: a malformed record (naming the file, the line and the field).
        """
        if not self.path.exists():
            return []
        lines = self.path.read_text(encoding="utf-8", errors="replace").split("\n")
        decisions = []
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                decisions.append(RungDecision.from_record(json.loads(line)))
            except ValueError as exc:
                if number == len(lines) and not isinstance(exc, RecordError):
                    break  # torn by a crash: no newline after it
                raise UserError(f"{self.path}: line {number}: {exc}") from None
        return decisions

    def append(self, decisions: Sequence[RungDecision], at: float) -> list[dict]:
        """Append `decisions` made `at` seconds into the run and sync them; returns the records."""
        records = [{**d.to_record(), "at": round(at, 3), "index": self.early.rungs(d.model).index(d.rung)}
                   for d in decisions]
        with open(self.path, "a", encoding="utf-8") as out:
            out.write("".join(json.dumps(r, allow_nan=False) + "\n" for r in records))
            out.flush()
            os.fsync(out.fileno())
        return records


def check_recorded_setting(run_dir: str | os.PathLike, settings: EarlyStopSettings) -> bool:
    """Whether the run directory records an early-stopping setting (a run started there); it
    must be `settings` (a resumed run decides by the rules it started with).

    Raises:
        UserError: the recorded setting differs, or cannot be read (one line).
    """
    path = Path(run_dir) / SETTING_FILE
    if not path.exists():
        return False
    try:
        recorded = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UserError(f"{path}: cannot read the run's early-stopping setting ({exc})") from None
    wanted = asdict(settings)
    if recorded != wanted:
        raise UserError(f"scheduler.early_stop: {_shown(wanted)} differs from the setting this run started with "
                        f"({_shown(recorded)}, in {path}); use the same one, or another --run-dir")
    return True


def _shown(setting: Mapping) -> str:
    return ", ".join(f"{k} {v}" for k, v in setting.items() if v is not None)


@dataclass(frozen=True)
class ResumedRungs:
    """A resumed run's early stopping.

    Attributes:
        early: the restored early stopping, ready for the driver.
        made: the decisions due that the records lacked (recorded by `resume_early_stopping`).
        stopped: the models early stopping has stopped (they count as ended).
        held: the models waiting at a rung for its other models.
    """

    early: EarlyStopping
    made: tuple[RungDecision, ...]
    stopped: frozenset[str]
    held: frozenset[str]


def resume_early_stopping(log: RungLog, metric: str, curves: Mapping[str, Sequence[Mapping]],
                          ended: Mapping[str, int]) -> ResumedRungs:
    """The run's early stopping, restored from `log` (a fresh run: from nothing).

    Args:
        log: the run's rung log; its ``early`` must be fresh (no decision yet).
        metric: the stop rule's metric every model uses (``val_accuracy`` or ``val_loss``).
        curves: each checkpointed model's history (a record per epoch, epoch 1 first).
        ended: the models whose own stop rule ended them, with their epochs.

    A model resumed at a rung it reached without a decision there (the job ended between its
    report and the decision) is decided now, in spec order; so is any rung the records filled.
    """
    early = log.early
    last = {m: len(c) for m, c in curves.items() if c and m not in ended}
    history = [(m, e, lower_is_better(curves[m][e - 1], metric))
               for e in range(1, 1 + max((len(c) for c in curves.values()), default=0))
               for m in early.models if m in curves and e <= len(curves[m]) and e != last.get(m)]
    made = early.restore(log.read(), ended, history)
    for model in early.models:
        if model in last:
            made += early.epoch_ended(model, last[model], lower_is_better(curves[model][-1], metric))
    if made:
        log.append(made, 0.0)
    return ResumedRungs(early, tuple(made), frozenset(early.stopped()), frozenset(early.paused()))


def start_early_stopping(run_dir: str | os.PathLike, settings: EarlyStopSettings, models: Sequence[str],
                         metric: str, curves: Mapping[str, Sequence[Mapping]],
                         ended: Mapping[str, int], groups: Mapping[str, str] | None = None) -> ResumedRungs | None:
    """The run's early stopping (None with method ``none``): its setting checked against the
    recorded one, its decisions restored (see `resume_early_stopping`); with `groups` (each
    model's group, `data.group_by`), each rung compares the models of one group only."""
    RungLog.check_setting(run_dir, settings)
    if settings.method == "none":
        return None
    log = RungLog(run_dir, create_early_stopping(settings, models, groups))
    return resume_early_stopping(log, metric, curves, ended)
