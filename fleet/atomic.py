"""Atomic file writes: a reader sees the old file or the whole new one, never a torn one."""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

from fleet.errors import UserError


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write `data` to a temporary file beside `path`, fsync it, rename it over `path`.

    Raises:
        UserError: the file cannot be written (missing or read-only directory, disk full).
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_replace(path, data)
    except OSError as exc:
        raise UserError(f"{path}: cannot write: {exc.strerror or exc}") from None
    _fsync_dir(path.parent)


def _write_replace(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as out:
            os.fchmod(out.fileno(), 0o666 & ~_umask())  # as open() would make it, not mkstemp's 0600
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems cannot fsync a directory
    finally:
        os.close(fd)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def json_safe(value: Any) -> Any:
    """Replace NaN and infinities (not JSON) by None, recursively."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def atomic_write_json(path: str | os.PathLike, value: Any) -> None:
    """Write strict JSON (NaN becomes null)."""
    text = json.dumps(json_safe(value), indent=2, allow_nan=False)
    atomic_write_text(path, text + "\n")


def atomic_link_or_copy(source: str | os.PathLike, path: str | os.PathLike) -> None:
    """Make `path` the same bytes as the file `source`, atomically: a hard link where the file
    system allows one (no copy: the bytes stay while either name does), else a copy.

    Raises:
        UserError: `source` cannot be read or `path` cannot be written.
    """
    source, path = Path(source), Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.link.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.unlink(missing_ok=True)
        os.link(source, tmp)
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        try:
            data = source.read_bytes()
        except OSError as exc:
            raise UserError(f"{source}: cannot read: {exc.strerror or exc}") from None
        atomic_write_bytes(path, data)
        return
    _fsync_dir(path.parent)
