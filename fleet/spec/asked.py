"""What an adaptive search asked: ``search/asked.jsonl`` in the run directory, a line per model
(``{"model", "study", "trial", "values"}``) written and synced before the model first starts.

Every reader of a run's models (the ranks at start-up, `fleet report`, `fleet ensemble`,
`fleet predict`) applies it to the spec's placeholders (`with_asked`); the coordinator appends
to it (`fleet.runtime.control.search`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from fleet.errors import UserError
from fleet.spec.load import Spec, asked_model

SEARCH_DIR = "search"
ASKED_FILE = "asked.jsonl"
RECORD_KEYS = ("model", "study", "trial", "values")


def asked_path(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / SEARCH_DIR / ASKED_FILE


def read_asked(run_dir: str | os.PathLike) -> dict[str, dict[str, Any]]:
    """Each asked model's record, by model id ({} before the first ask). A last line cut off
    by a crash mid-write is left out (never synced: its model never started).

    Raises:
        UserError: a malformed record (naming the file and the line).
    """
    path = asked_path(run_dir)
    if not path.exists():
        return {}
    lines = path.read_text(encoding="utf-8", errors="replace").split("\n")
    records: dict[str, dict[str, Any]] = {}
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            if number == len(lines):
                break  # torn by a crash: no newline after it
            raise UserError(f"{path}: line {number}: not JSON") from None
        if not isinstance(record, dict) or any(key not in record for key in RECORD_KEYS):
            raise UserError(f"{path}: line {number}: expected the keys {', '.join(RECORD_KEYS)}")
        records[record["model"]] = record
    return records


def with_asked(spec: Spec, asked: dict[str, dict[str, Any]], where: str = ASKED_FILE) -> Spec:
    """`spec` with each asked placeholder's searched values (`asked`: `read_asked`'s).

    Raises:
        UserError: a record names a model the spec has no placeholder of (`where`: the file).
    """
    if not asked:
        return spec
    placeholders = {m.id: m for m in spec.models if m.search is not None}
    unknown = sorted(set(asked) - set(placeholders))
    if unknown:
        raise UserError(f"{where}: model {unknown[0]!r} is no placeholder of this spec's searches")
    return spec.with_models({m: asked_model(placeholders[m], r["values"]) for m, r in asked.items()})
