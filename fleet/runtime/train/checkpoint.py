"""Model checkpoints in the run directory: atomic, checksummed, two kept per model.

Layout (one directory per model, written only by that model's group master)::

    <run_dir>/checkpoints/<model_id>/
        ckpt-<epochs:05d>-<epoch_samples:09d>.npz  ModelCheckpoint.to_dict() as a fleet.safetree
        ckpt-...npz                                the previous one (kept as a fallback)
        latest.json                                the commit record (see below)

The store knows no framework: a checkpoint's engine state is the bytes the engine gave
(`Engine.state_bytes()`), and the file around them is a `fleet.safetree` archive (JSON and
``.npy`` arrays) that loads without running code. Files named ``ckpt-*.pt`` were written by
fleet up to commit 99f14b6 (`torch.save` of the whole dict); the framework that wrote them
reads them safely (`fleet.engines.registry.read_legacy_checkpoint`: torch's
``weights_only`` loader) or refuses them, so a run started then still resumes.

`CheckpointStore.save` writes the checkpoint file atomically (temporary file, fsync, rename;
`fleet.atomic`), then atomically replaces ``latest.json``, then deletes the files that
``latest.json`` no longer lists. ``latest.json`` is therefore the commit record: a checkpoint
file that it does not list (a crash between the two writes) does not exist for `load`.
It holds the newest checkpoint's ``file``, ``sha256`` (of the file's bytes), ``bytes``,
``epochs``, ``epoch_samples``, ``converged`` and ``time`` (Unix seconds), and ``previous``:
the same fields for the older files still kept, newest first.

`CheckpointStore.load` verifies the size and SHA-256 of the newest file and falls back to the
previous one, with a warning, when it is missing, corrupt, refused or not this model's; when
none is usable it raises a one-line `UserError` naming the newest file. A checksum only
proves that the file is the one ``latest.json`` names, and anyone who can write the run
directory can update both: loading therefore never unpickles or runs anything from a file.

Concurrency: writers of *different* models may save at the same time (threads or processes,
also on a shared parallel file system): each touches only its own model's directory and
relies on atomic rename, never on file locks. One model has one writer at a time.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from fleet import safetree
from fleet.atomic import atomic_write_bytes, atomic_write_json
from fleet.engines.registry import read_legacy_checkpoint
from fleet.errors import UserError

CHECKPOINT_FORMAT = "fleet.checkpoint/2"
LEGACY_FORMAT = "fleet.checkpoint/1"  # torch.save of the whole dict, engine state as tensors
LATEST_SCHEMA = 1
LATEST = "latest.json"
SUFFIX, LEGACY_SUFFIX = ".npz", ".pt"
_ENTRY_KEYS = ("file", "sha256", "bytes", "epochs", "epoch_samples", "converged", "time")
_FILE_PATTERN = re.compile(r"^ckpt-\d{5,}-\d{9,}(-r\d+)?\.(npz|pt)$")
_SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "model_id": (str,), "engine_state": (bytes,), "stop": (dict,), "history": (list,), "epochs": (int,),
    "epoch_samples": (int,), "gpu_seconds": (int, float), "converged": (bool,), "stop_reason": (str, type(None)),
    "meta": (dict,),
}

_log = logging.getLogger(__name__)


@dataclass
class ModelCheckpoint:
    """Everything needed to continue one model where it stopped.

    Attributes:
        model_id: the `ModelSpec.id`.
        engine_state: `Engine.state_bytes()` (weights, optimizer, schedule position, RNG),
            opaque to the store; `Engine.load_state_bytes` restores it.
        stop: `StopTracker.to_dict()`.
        history: one record per completed epoch (epoch, train_loss, val_loss, val_accuracy,
            samples_per_s, lr, time, ...).
        epochs: epochs completed.
        epoch_samples: samples consumed of the current, unfinished epoch (the data position).
        gpu_seconds: GPU time spent on the model so far (GPUs x seconds).
        converged: the stop rule has fired.
        stop_reason: `StopReason.value` when converged.
        meta: free-form context (round, stream, gpus, wall time, fleet version).
    """

    model_id: str
    engine_state: bytes
    stop: dict
    history: list[dict] = field(default_factory=list)
    epochs: int = 0
    epoch_samples: int = 0
    gpu_seconds: float = 0.0
    converged: bool = False
    stop_reason: str | None = None
    meta: dict = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """A plain dict of plain values and the engine's bytes (what the file holds)."""
        return {"format": CHECKPOINT_FORMAT, **{f.name: getattr(self, f.name) for f in fields(self)}}

    @classmethod
    def from_dict(cls, data: Any) -> "ModelCheckpoint":
        """Inverse of `to_dict` (also of an old file's dict, its engine state re-encoded as
        bytes); raises ValueError for anything else, naming the first bad field."""
        if not isinstance(data, dict) or data.get("format") not in (CHECKPOINT_FORMAT, LEGACY_FORMAT):
            raise ValueError(f"not a fleet checkpoint ({CHECKPOINT_FORMAT})")
        for name, types in _FIELD_TYPES.items():
            if name not in data:
                raise ValueError(f"checkpoint lacks {name!r}")
            if not isinstance(data[name], types) or (isinstance(data[name], bool) and bool not in types):
                raise ValueError(f"checkpoint field {name!r}: expected {' or '.join(t.__name__ for t in types)}, "
                                 f"got {type(data[name]).__name__}")
        return cls(**{name: data[name] for name in _FIELD_TYPES})


@dataclass(frozen=True)
class SaveInfo:
    """What one `CheckpointStore.save` wrote and how long it took (serialise + hash + write)."""

    model_id: str
    path: Path
    sha256: str
    bytes: int
    seconds: float


class _Unusable(Exception):
    """One checkpoint file cannot be used; the message says why."""


def _default_warning(message: str) -> None:
    _log.warning("%s", message)


class CheckpointStore:
    """The ``checkpoints/`` directory of a run.

    Args:
        run_dir: the run directory (paths in messages are shown under it as given).
        keep: checkpoint files kept per model (at least 1; 2 keeps one fallback).
        on_warning: called with a one-line message when `load` falls back to an older file
            or `save` finds an unreadable ``latest.json``; default: the ``fleet`` logger.

    Attributes:
        save_seconds: total time spent in `save` by this store (all models, all threads).
        load_seconds: total time spent in `load`.
        last_save: the latest `SaveInfo` of each model saved through this store.
    """

    def __init__(self, run_dir: str | os.PathLike, keep: int = 2, on_warning: Callable[[str], None] | None = None):
        if keep < 1:
            raise ValueError(f"keep: expected at least 1 checkpoint per model, got {keep}")
        self.run_dir = Path(run_dir)
        self.root = self.run_dir / "checkpoints"
        self.keep = keep
        self._warn = on_warning or _default_warning
        self.save_seconds = 0.0
        self.load_seconds = 0.0
        self.last_save: dict[str, SaveInfo] = {}
        self._lock = threading.Lock()

    def model_dir(self, model_id: str) -> Path:
        """``checkpoints/<model_id>`` (the id must be a valid model id: no path separators)."""
        if not _SAFE_ID.match(model_id):
            raise ValueError(f"model id {model_id!r}: not usable as a directory name")
        return self.root / model_id

    # -- saving -----------------------------------------------------------------------------

    def save(self, ckpt: ModelCheckpoint) -> Path:
        """Write `ckpt` atomically, commit it in ``latest.json``, prune older files.

        Returns:
            The checkpoint file's path. Timing and checksum: `last_save[ckpt.model_id]`.

        Raises:
            UserError: the run directory cannot be written.
        """
        start = time.perf_counter()
        directory = self.model_dir(ckpt.model_id)
        data = _serialize(ckpt)
        kept = self._entries_for_save(ckpt.model_id)
        name = _unique_name(ckpt.epochs, ckpt.epoch_samples, {e["file"] for e in kept})
        atomic_write_bytes(directory / name, data)
        entry = {
            "file": name,
            "sha256": hashlib.sha256(data).hexdigest(),
            "bytes": len(data),
            "epochs": int(ckpt.epochs),
            "epoch_samples": int(ckpt.epoch_samples),
            "converged": bool(ckpt.converged),
            "time": round(time.time(), 3),
        }
        if "visited" in ckpt.meta:  # partitioned data: the partitions visited in the current epoch
            entry["visited"] = [int(k) for k in ckpt.meta["visited"]]
        previous = kept[: self.keep - 1]
        atomic_write_json(
            directory / LATEST, {"schema": LATEST_SCHEMA, "model_id": ckpt.model_id, **entry, "previous": previous}
        )
        self._prune(directory, {name, *(e["file"] for e in previous)})
        info = SaveInfo(ckpt.model_id, directory / name, entry["sha256"], len(data), time.perf_counter() - start)
        with self._lock:
            self.save_seconds += info.seconds
            self.last_save[ckpt.model_id] = info
        return info.path

    def _entries_for_save(self, model_id: str) -> list[dict]:
        """The committed entries, newest first; an unreadable latest.json starts afresh."""
        try:
            return self._entries(model_id) or []
        except UserError as exc:
            self._warn(f"{exc}; starting a new checkpoint history")
            return []

    def _prune(self, directory: Path, keep: set[str]) -> None:
        """Delete checkpoint files not committed and temporary files left by a crash."""
        for path in directory.iterdir():
            stale_ckpt = _FILE_PATTERN.match(path.name) and path.name not in keep
            stale_tmp = path.name.startswith(".") and path.name.endswith(".tmp")
            if stale_ckpt or stale_tmp:
                try:
                    path.unlink()
                except FileNotFoundError:
                    pass
                except OSError as exc:
                    self._warn(f"{path}: cannot delete old checkpoint: {exc.strerror or exc}")

    # -- loading ----------------------------------------------------------------------------

    def latest_info(self, model_id: str) -> dict | None:
        """The parsed ``latest.json`` of a model (cheap: no checkpoint is read), or None.

        Raises:
            UserError: ``latest.json`` exists but is unreadable or malformed.
        """
        path = self.model_dir(model_id) / LATEST
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise UserError(f"{path}: cannot read: {exc.strerror or exc}") from None
        try:
            info = json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise UserError(f"{path}: invalid JSON (file corrupt?)") from None
        _check_latest(info, model_id, path)
        return info

    def load(self, model_id: str) -> ModelCheckpoint | None:
        """The newest usable checkpoint of `model_id`, or None when it has none.

        Falls back to older kept files (with a warning) when the newest is missing, corrupt or
        does not match its checksum.

        Raises:
            UserError: a checkpoint exists but no kept file is usable (names the newest file),
                or ``latest.json`` is unreadable.
        """
        start = time.perf_counter()
        entries = self._entries(model_id)
        if entries is None:
            return None
        directory = self.model_dir(model_id)
        failures: list[tuple[Path, str]] = []
        for entry in entries:
            path = directory / entry["file"]
            try:
                ckpt = _read_checkpoint(path, entry, model_id)
            except _Unusable as exc:
                failures.append((path, str(exc)))
                continue
            for bad, problem in failures:
                self._warn(f"{bad}: {problem}; resuming {model_id!r} from the older {entry['file']}")
            with self._lock:
                self.load_seconds += time.perf_counter() - start
            return ckpt
        raise UserError(_no_usable_message(failures))

    def load_all(self, model_ids: Iterable[str]) -> dict[str, ModelCheckpoint]:
        """`load` each model; models without a checkpoint are left out of the dict."""
        found = {model_id: self.load(model_id) for model_id in model_ids}
        return {model_id: ckpt for model_id, ckpt in found.items() if ckpt is not None}

    def _entries(self, model_id: str) -> list[dict] | None:
        """Committed files, newest first; None when the model has no latest.json."""
        info = self.latest_info(model_id)
        if info is None:
            return None
        newest = {key: info[key] for key in _ENTRY_KEYS}
        return [newest, *info["previous"]]


# -- helpers --------------------------------------------------------------------------------


def _serialize(ckpt: ModelCheckpoint) -> bytes:
    if not isinstance(ckpt.engine_state, bytes):
        raise TypeError(f"checkpoint of {ckpt.model_id!r}: engine_state must be Engine.state_bytes(), "
                        f"got a {type(ckpt.engine_state).__name__}")
    return safetree.dumps(ckpt.to_dict())


def _unique_name(epochs: int, epoch_samples: int, taken: set[str]) -> str:
    """``ckpt-EEEEE-SSSSSSSSS.npz``; a ``-r<k>`` suffix when a kept file has that name.

    Never overwriting a committed file keeps the fallback valid if the process dies between
    writing the new file and committing it.
    """
    if epochs < 0 or epoch_samples < 0:
        raise ValueError(f"checkpoint position: expected epochs, epoch_samples >= 0, got {epochs}, {epoch_samples}")
    base = f"ckpt-{epochs:05d}-{epoch_samples:09d}"
    name, k = f"{base}{SUFFIX}", 0
    while name in taken:
        k += 1
        name = f"{base}-r{k}{SUFFIX}"
    return name


def _check_latest(info: Any, model_id: str, path: Path) -> None:
    """Raise a UserError naming `path` unless `info` is a well-formed latest.json."""

    def bad(problem: str) -> UserError:
        return UserError(f"{path}: {problem} (file corrupt?)")

    if not isinstance(info, dict) or info.get("schema") != LATEST_SCHEMA:
        raise bad(f"expected a checkpoint record with schema {LATEST_SCHEMA}")
    if info.get("model_id") != model_id:
        raise bad(f"model_id is {info.get('model_id')!r}, expected {model_id!r}")
    previous = info.get("previous")
    if not isinstance(previous, list):
        raise bad("previous: expected a list")
    for where, entry in [("", info), *((f"previous[{k}].", e) for k, e in enumerate(previous))]:
        if not isinstance(entry, dict) or any(key not in entry for key in _ENTRY_KEYS):
            raise bad(f"{where or 'top level'}: expected the keys {', '.join(_ENTRY_KEYS)}")
        if not isinstance(entry["file"], str) or not _FILE_PATTERN.match(entry["file"]):
            raise bad(f"{where}file: not a checkpoint file name: {entry['file']!r}")
        if not isinstance(entry["bytes"], int) or not isinstance(entry["sha256"], str):
            raise bad(f"{where}bytes/sha256: expected an integer and a hex string")


def _read_checkpoint(path: Path, entry: dict, model_id: str) -> ModelCheckpoint:
    """Read, verify and decode one committed file (raises `_Unusable`)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise _Unusable("missing") from None
    except OSError as exc:
        raise _Unusable(f"cannot read: {exc.strerror or exc}") from None
    if len(data) != entry["bytes"]:
        raise _Unusable(f"{len(data)} bytes, expected {entry['bytes']} (file truncated?)")
    if hashlib.sha256(data).hexdigest() != entry["sha256"]:
        raise _Unusable("checksum mismatch (file corrupt?)")
    return _checkpoint_of(path.suffix, data, model_id)


def decode_checkpoint(data: bytes, model_id: str, path: Path) -> ModelCheckpoint:
    """The checkpoint of `model_id` in `data`, the bytes of the ``.npz`` file `path` (checked by
    the caller); never runs code from them.

    Raises:
        UserError: not a readable checkpoint of that model (one line naming `path`).
    """
    try:
        return _checkpoint_of(SUFFIX, data, model_id)
    except _Unusable as exc:
        raise UserError(f"{path}: {exc}") from None


def _checkpoint_of(suffix: str, data: bytes, model_id: str) -> ModelCheckpoint:
    """Decode a file's bytes into `model_id`'s checkpoint (raises `_Unusable`)."""
    try:
        ckpt = ModelCheckpoint.from_dict(_decode(suffix, data))
    except ValueError as exc:  # safetree.TreeError, a refused or damaged old file, a bad field
        raise _Unusable(f"not a readable checkpoint: {' '.join(str(exc).split())[:300]}") from None
    if ckpt.model_id != model_id:
        raise _Unusable(f"holds model {ckpt.model_id!r}, expected {model_id!r}")
    return ckpt


def _decode(suffix: str, data: bytes) -> Any:
    """A file's dict: a safetree, or an old file read by the framework that wrote it. Neither
    runs code from the file (raises ValueError)."""
    if suffix == SUFFIX:
        return safetree.loads(data)
    legacy = read_legacy_checkpoint(data)
    if legacy is None:
        raise ValueError(f"no installed framework reads this {LEGACY_SUFFIX} file")
    return legacy


def _no_usable_message(failures: list[tuple[Path, str]]) -> str:
    (newest, problem), older = failures[0], failures[1:]
    message = f"{newest}: {problem}"
    if older:
        message += "; older checkpoints unusable too: " + ", ".join(f"{p.name}: {why}" for p, why in older)
    return message
