"""The file `fleet predict` writes: each sample's class probabilities and uncertainty, as a
``.npz`` of plain arrays (no pickle) or a ``.csv`` with one row per sample."""

from __future__ import annotations

import csv
import io
import os
from pathlib import Path

import numpy as np

from fleet.atomic import atomic_write_bytes, atomic_write_text
from fleet.errors import UserError
from fleet.report.greedy_ensemble import Uncertainty

FORMATS = (".npz", ".csv")


def check_output(path: str | os.PathLike) -> Path:
    """`path` names a ``.npz`` or ``.csv`` file (UserError naming ``--out`` otherwise)."""
    path = Path(path)
    if path.suffix.lower() not in FORMATS:
        raise UserError(f"--out: {path}: expected a file ending in .npz or .csv")
    if path.is_dir():
        raise UserError(f"--out: {path}: is a directory")
    return path


def write_prediction_file(path: Path, probabilities: np.ndarray, spread: Uncertainty, labels: np.ndarray,
                          names: list[str], models: dict[str, float]) -> None:
    """Write the per-sample probabilities (N, C) and uncertainty to `path` (.npz or .csv), atomically.

    The .npz holds ``probabilities`` (float32), ``entropy``, ``mutual_information``,
    ``disagreement`` (float32, N each), ``labels`` (int64: the data set's own), ``names`` (each
    sample's file or ``file.h5[i]``), ``models`` and ``weights`` (the members applied).
    """
    columns = {"entropy": spread.entropy, "mutual_information": spread.mutual_information,
               "disagreement": spread.disagreement}
    if path.suffix.lower() == ".csv":
        atomic_write_text(path, _csv_text(probabilities, columns, labels, names))
        return
    out = io.BytesIO()
    np.savez(out, probabilities=probabilities.astype(np.float32), labels=np.asarray(labels, dtype=np.int64),
             names=np.asarray(names, dtype=str), models=np.asarray(list(models), dtype=str),
             weights=np.asarray(list(models.values()), dtype=np.float64),
             **{k: v.astype(np.float32) for k, v in columns.items()})
    atomic_write_bytes(path, out.getvalue())


def _csv_text(probabilities: np.ndarray, columns: dict[str, np.ndarray], labels: np.ndarray, names: list[str]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    classes = probabilities.shape[1]
    writer.writerow(["name", "label", "predicted", *(f"p{c}" for c in range(classes)), *columns])
    predicted = probabilities.argmax(axis=1)
    for i in range(len(probabilities)):
        writer.writerow([names[i], int(labels[i]), int(predicted[i]), *(f"{p:.6g}" for p in probabilities[i]),
                         *(f"{v[i]:.6g}" for v in columns.values())])
    return out.getvalue()
