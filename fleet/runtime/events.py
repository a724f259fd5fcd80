"""`events.jsonl`: the run's append-only log (round start/end, epochs, convergence, checkpoints)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from fleet.atomic import json_safe


class EventLog:
    """Appends one JSON object per line; each line is flushed at once, `sync` makes it durable."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a", encoding="utf-8")

    def write(self, kind: str, **fields: Any) -> dict:
        event = {"time": round(time.time(), 3), "event": kind, **json_safe(fields)}
        self._file.write(json.dumps(event, allow_nan=False) + "\n")
        self._file.flush()
        return event

    def sync(self) -> None:
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        if not self._file.closed:
            self.sync()
            self._file.close()


def read_events(path: str | os.PathLike) -> list[dict]:
    """The records of a JSON-lines log (``events.jsonl``, ``visits.jsonl``); none when it does
    not exist. A line torn by a crash mid-write, or cut off by a job still writing it, is left
    out."""
    path = Path(path)
    if not path.exists():
        return []
    events = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            events.append(record)
    return events


def first_batch_s(events: list[dict]) -> float | None:
    """Seconds from the last ``run_start`` of `events` to that run's first training batch: the
    earliest member start plus its ``start_s`` (StartMember to first batch, in the member's
    first report); None before any member has reported one."""
    starts = [k for k, e in enumerate(events) if e.get("event") == "run_start"]
    if not starts:
        return None
    began, launched, first = events[starts[-1]]["time"], {}, None
    for event in events[starts[-1]:]:
        kind, model = event.get("event"), event.get("model")
        if kind == "member_start":
            launched[model] = event["time"]
        elif kind in ("epoch", "member_left") and event.get("start_s") and model in launched:
            at = launched.pop(model) + float(event["start_s"])
            first = at if first is None else min(first, at)
    return None if first is None else max(0.0, first - began)
