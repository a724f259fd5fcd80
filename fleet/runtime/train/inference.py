"""`fleet predict`'s work: a run's chosen models (its ensemble, or one model) loaded from their
best epochs' checkpoints, applied to a data set through the run's own preprocessing in eval
mode. Checkpoints are loaded as a resume loads them: checksummed, never unpickled."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fleet.engines.factory import create_engine
from fleet.engines.options import EngineOptions
from fleet.errors import UserError
from fleet.inspect import input_shape
from fleet.report.predictions import VALIDATION, read_kept
from fleet.report.run_ensemble import ENSEMBLE, read_ensemble
from fleet.runtime.train.checkpoint import decode_checkpoint
from fleet.spec import Spec
from fleet.spec.checks import check_pipeline
from fleet.spec.sections import Source
from preprocess.readers import open_reader
from preprocess.transforms import Pipeline

BLOCK = 1024  # samples read, decoded and predicted at a time


@dataclass(frozen=True)
class Member:
    """A model applied to new data: its best epoch's engine and its weight in the ensemble."""

    model: str
    weight: float
    engine: object


def chosen_models(run_dir: Path, model: str | None, group: str | None = None) -> dict[str, float]:
    """The models to apply and their weights: `model` alone, else the run's ``ensemble.json``
    (with groups, the ensemble of `group`, a raw key)."""
    if model is not None:
        return {model: 1.0}
    doc = read_ensemble(run_dir)
    if doc is None:
        raise UserError(f"{run_dir}: no {ENSEMBLE}: run 'fleet ensemble {run_dir}' first, or name one model with --model")
    if "groups" in doc:
        doc = _group_ensemble(doc, group, run_dir)
    elif group is not None:
        raise UserError(f"--group: {run_dir / ENSEMBLE} holds one ensemble of the whole run, not one per group")
    return {m["model"]: float(m["weight"]) for m in doc["members"]}


def _group_ensemble(doc: dict, group: str | None, run_dir: Path) -> dict:
    """The ensemble of `group` in a per-group ``ensemble.json`` (UserError: none named, or unknown)."""
    keys = list(doc["groups"])
    shown = ", ".join(keys[:8]) + (", ..." if len(keys) > 8 else "")
    if group is None:
        raise UserError(f"{run_dir / ENSEMBLE}: one ensemble per group (data.group_by): name one with --group KEY "
                        f"({shown}), or a model with --model")
    if group not in doc["groups"]:
        raise UserError(f"--group: {group!r} has no ensemble in {run_dir / ENSEMBLE} (its groups: {shown})")
    return doc["groups"][group]


def load_members(spec: Spec, run_dir: Path, weights: dict[str, float], device: str) -> list[Member]:
    """Each chosen model's engine on `device`, loaded from its best epoch's kept checkpoint."""
    known = {m.id: m for m in spec.models}
    members = []
    for model_id, weight in weights.items():
        if model_id not in known:
            raise UserError(f"--model: {model_id!r} is no model of {run_dir} (its models: {', '.join(sorted(known)[:8])}"
                            f"{', ...' if len(known) > 8 else ''})")
        kept = read_kept(run_dir, model_id)
        if kept is None:
            raise UserError(f"{run_dir}: model {model_id!r} kept no predictions or best checkpoint (predictions/"
                            f"{model_id}/best.json): the run was made by a fleet that kept none")
        classes = kept.probabilities(VALIDATION).shape[1]
        options = EngineOptions(known[model_id], input_shape(spec), classes, device=device)
        engine = create_engine(options)
        checkpoint = decode_checkpoint(kept.checkpoint_bytes(), model_id, kept.directory / kept.checkpoint["file"])
        engine.load_state_bytes(checkpoint.engine_state)
        members.append(Member(model_id, weight, engine))
    return members


def data_of(spec: Spec, path: str, source: str | None):
    """The spec's data section pointed at `path`: `source` (``imagefolder`` or ``hdf5``; by
    default a file or a folder of ``.h5`` files is ``hdf5``, another folder ``imagefolder``),
    the same image size, channels and classes; checked against the run's preprocessing."""
    where = Path(os.path.expanduser(path))
    if not where.exists():
        raise UserError(f"--data: no such file or directory: {path}")
    if source is None:
        source = "hdf5" if where.is_file() or any(where.glob("*.h5")) else "imagefolder"
    data = spec.data.model_copy(update={"source": Source(source), "path": str(where.resolve()), "samples": None,
                                        "partitioned": False, "validation": "all"})
    check_pipeline(data, spec.preprocess)
    return data


def predicted_blocks(spec: Spec, data, members: list[Member]) -> Iterator[tuple[np.ndarray, np.ndarray, list[str]]]:
    """Per block of samples: every member's probabilities (M, n, C), the labels and the names."""
    pipeline = Pipeline(spec.preprocess, data)
    with open_reader(data, seed=spec.seed) as reader:
        for start in range(0, len(reader), BLOCK):
            raw = reader.read(np.arange(start, min(start + BLOCK, len(reader))))
            x = pipeline(raw, np.random.default_rng(spec.seed), train=False)
            yield np.stack([m.engine.predict(x) for m in members]), raw.labels, list(raw.names)
