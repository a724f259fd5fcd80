"""Writing a data set safely: build it beside its destination, then move it into place; progress bars.

A failure half-way (a corrupt input file, Ctrl-C) leaves the destination as it was.
"""

from __future__ import annotations

import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Sequence

from tqdm import tqdm

from fleet.errors import UserError


def _non_empty(path: Path) -> bool:
    if path.is_dir():
        return any(path.iterdir())
    return path.exists()


def _inside(inner: Path, outer: Path) -> bool:
    inner, outer = inner.resolve(), outer.resolve()
    return inner == outer or outer in inner.parents


def check_output(out: Path, force: bool, inputs: Sequence[Path] = ()) -> None:
    """Refuse an `out` that exists and is not empty (unless `force`), or that overlaps an input.

    Raises:
        UserError: naming `out`.
    """
    for source in inputs:
        if _inside(source, out):
            raise UserError(f"{out}: the output would replace the input {source}; choose another --out")
        if source.is_dir() and _inside(out, source):
            raise UserError(f"{out}: the output would land inside the input {source}; choose another --out")
    if _non_empty(out) and not force:
        raise UserError(f"{out}: already exists and is not empty (pass --force to replace it)")
    for precious in (Path.cwd(), Path.home()):
        if out.exists() and _inside(precious, out):
            raise UserError(f"{out}: refusing to replace a directory that holds {precious}; choose another --out")


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


@contextmanager
def staged_output(out: str | os.PathLike, force: bool = False, inputs: Sequence[Path] = ()) -> Iterator[Path]:
    """Yield a temporary path beside `out`; on success it replaces `out`, on error it is removed.

    Args:
        out: the destination (a file or a directory; the caller creates it at the yielded path).
        force: replace an existing, non-empty `out`.
        inputs: paths the command reads; `out` may not contain them.

    Raises:
        UserError: `out` exists and is not empty without `force`, or would swallow an input.
    """
    out = Path(out)
    check_output(out, force, inputs)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = out.parent / f".{out.name}.tmp-{os.getpid()}"
    _remove(staging)
    try:
        yield staging
    except BaseException:
        _remove(staging)
        raise
    _remove(out)
    os.replace(staging, out)


def progress_bar(total: int, desc: str, enabled: bool = True) -> tqdm:
    """A tqdm bar on stderr, shown only on a terminal so that batch-job logs stay clean."""
    return tqdm(total=total, desc=desc, unit="img", disable=None if enabled else True)
