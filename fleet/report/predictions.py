"""Each model's best-epoch predictions in the run directory: written by its group master as the
model trains, read by `fleet ensemble` and `fleet predict`.

Layout::

    <run_dir>/predictions/
        labels-validation.npy          int64: the validation split's labels, in the predictions' order
        labels-test.npy                the same of the test split (`data.test_fraction`)
        labels-validation-<group>.npy  with `data.group_by`: each group's own (<group>: the group's
        labels-test-<group>.npy        part of its models' ids), instead of the two above
        <model>/
            best.json                  the commit record: epoch, metric and value, files, checkpoint
            e<epoch:05d>-validation.npy float32 (N, classes): the best epoch's class probabilities
            e<epoch:05d>-test.npy       the same on the test split
            e<epoch:05d>.npz            the best epoch's checkpoint (a hard link of the one saved then)

"Best" is the leaderboard's: the first epoch whose stop metric beats every earlier epoch's
(higher ``val_accuracy``, lower ``val_loss``). Every file is written atomically and
``best.json`` last: the files it names are one epoch's, and files of other epochs are deleted
after it. Arrays are plain ``.npy`` read with ``allow_pickle=False``.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fleet.atomic import atomic_link_or_copy, atomic_write_bytes, atomic_write_json
from fleet.errors import UserError

PREDICTIONS = "predictions"
RECORD = "best.json"
SCHEMA = 1
VALIDATION, TEST = "validation", "test"
SPLITS = (VALIDATION, TEST)


def predictions_dir(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / PREDICTIONS


def labels_path(run_dir: str | os.PathLike, split: str, group: str | None = None) -> Path:
    """The labels file of `split`; of one group's split where `group` (its id part) is given."""
    return predictions_dir(run_dir) / (f"labels-{split}.npy" if group is None else f"labels-{split}-{group}.npy")


def improves(value: float | None, earlier: Iterable[float | None], metric: str) -> bool:
    """Whether an epoch's `value` of `metric` beats every `earlier` one (as the leaderboard
    picks a model's best epoch: the first of equals wins; non-finite values never count)."""
    if value is None or not math.isfinite(value):
        return False
    higher = metric == "val_accuracy"
    for before in earlier:
        if before is not None and math.isfinite(before) and (before >= value if higher else before <= value):
            return False
    return True


def npy_bytes(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, np.ascontiguousarray(array), allow_pickle=False)
    return out.getvalue()


def read_array(path: Path) -> np.ndarray:
    """A ``.npy`` file, never unpickled (UserError naming the file when it cannot be read)."""
    try:
        return np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise UserError(f"{path}: missing") from None
    except (OSError, ValueError) as exc:
        raise UserError(f"{path}: not a readable .npy array: {' '.join(str(exc).split())[:200]}") from None


def write_labels(run_dir: str | os.PathLike, split: str, labels: np.ndarray, group: str | None = None) -> None:
    """The labels of `split` (of one group's, by its id part), once (the first master to need
    them writes them)."""
    path = labels_path(run_dir, split, group)
    if not path.exists():
        atomic_write_bytes(path, npy_bytes(np.asarray(labels, dtype=np.int64)))


@dataclass(frozen=True)
class Checkpoint:
    """The checkpoint file saved after the best epoch (`fleet.runtime.train.checkpoint`)."""

    path: Path
    sha256: str
    bytes: int


def commit_best(run_dir: str | os.PathLike, model_id: str, epoch: int, metric: Mapping[str, float],
                probabilities: Mapping[str, np.ndarray], checkpoint: Checkpoint | None) -> None:
    """Keep `model_id`'s new best epoch: its class probabilities per split, a link to its
    checkpoint, then ``best.json`` naming them (`metric`: ``{name: value}``); older epochs'
    files go."""
    directory = predictions_dir(run_dir) / model_id
    prefix = f"e{epoch:05d}"
    files = {}
    for split, probs in probabilities.items():
        files[split] = f"{prefix}-{split}.npy"
        atomic_write_bytes(directory / files[split], npy_bytes(np.asarray(probs, dtype=np.float32)))
    record = {"schema": SCHEMA, "model": model_id, "epoch": int(epoch), **_metric_fields(metric), "files": files,
              "checkpoint": None, "time": round(time.time(), 3)}
    if checkpoint is not None:
        atomic_link_or_copy(checkpoint.path, directory / f"{prefix}.npz")
        record["checkpoint"] = {"file": f"{prefix}.npz", "sha256": checkpoint.sha256, "bytes": checkpoint.bytes}
    atomic_write_json(directory / RECORD, record)
    keep = {RECORD, *files.values(), f"{prefix}.npz"}
    for path in directory.iterdir():
        if path.name not in keep:
            path.unlink(missing_ok=True)


def _metric_fields(metric: Mapping[str, float]) -> dict:
    (name, value), = metric.items()
    return {"metric": name, "value": float(value)}


@dataclass(frozen=True)
class KeptPredictions:
    """What ``best.json`` of one model says.

    Attributes:
        model: the model's id.
        epoch: its best epoch (from 1).
        metric: the stop metric's name; value: its value at that epoch.
        files: the probabilities' file per split kept.
        checkpoint: the best epoch's checkpoint (`file`, `sha256`, `bytes`), or None.
        directory: the model's folder of predictions.
    """

    model: str
    epoch: int
    metric: str
    value: float
    files: dict[str, str]
    checkpoint: dict | None
    directory: Path

    def probabilities(self, split: str) -> np.ndarray:
        """The kept probabilities of `split` (UserError when none were kept or they are damaged)."""
        if split not in self.files:
            raise UserError(f"{self.directory / RECORD}: no {split} predictions kept for model {self.model!r}")
        return read_array(self.directory / self.files[split])

    def checkpoint_bytes(self) -> bytes:
        """The best epoch's checkpoint file, its size and SHA-256 checked (UserError otherwise)."""
        if not self.checkpoint:
            raise UserError(f"{self.directory / RECORD}: no checkpoint of the best epoch kept for model {self.model!r}")
        path = self.directory / self.checkpoint["file"]
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise UserError(f"{path}: cannot read: {exc.strerror or exc}") from None
        if len(data) != self.checkpoint["bytes"] or hashlib.sha256(data).hexdigest() != self.checkpoint["sha256"]:
            raise UserError(f"{path}: does not match its size and checksum in {RECORD} (file corrupt?)")
        return data


def read_kept(run_dir: str | os.PathLike, model_id: str) -> KeptPredictions | None:
    """`model_id`'s ``best.json`` (None: it kept no predictions; UserError: malformed)."""
    directory = predictions_dir(run_dir) / model_id
    path = directory / RECORD
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise UserError(f"{path}: cannot read: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        files = {str(k): str(v) for k, v in doc["files"].items() if k in SPLITS and "/" not in str(v)}
        checkpoint = doc.get("checkpoint")
        if checkpoint is not None and "/" in str(checkpoint["file"]):
            raise ValueError("a checkpoint outside its folder")
        return KeptPredictions(str(doc["model"]), int(doc["epoch"]), str(doc["metric"]), float(doc["value"]),
                               files, checkpoint, directory)
    except (KeyError, TypeError, ValueError, AttributeError):
        raise UserError(f"{path}: not a record of kept predictions (file corrupt?)") from None


def read_labels(run_dir: str | os.PathLike, split: str, group: str | None = None) -> np.ndarray | None:
    """The labels of `split` (of one group's, by its id part; None where none were written)."""
    path = labels_path(run_dir, split, group)
    return read_array(path).astype(np.int64) if path.exists() else None
