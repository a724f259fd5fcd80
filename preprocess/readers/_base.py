"""The dataset reader interface: what a preprocessor process reads samples through.

Contract (every implementation):

* **Ownership and processes.** A reader belongs to the process that opened it. Each
  preprocessor process calls `open_reader` itself; file handles (h5py, open files) are
  opened lazily on the first `read` in that process and are never shared across `fork`.
  A reader may be pickled (handles are dropped and reopened on the other side).
* **Thread safety.** None: one thread per reader. Open one reader per thread if needed.
* **States.** Open (after construction, which validates the data set cheaply: layout,
  dtypes, shapes, labels) -> closed (`close()`, idempotent). `read` after `close` reopens.
* **Cheap metadata.** `__len__`, `num_classes`, `labels` (int64, every sample's label),
  `class_names`, `encoded`, `image_shape`, `where` and `classes_inferred` never decode a sample.
* **Reading.** `read(indices)` returns a `RawBatch` in the order of `indices` (repeats
  allowed). Encoded readers return the file bytes; the others return a uint8 NHWC array.
  An index outside ``[0, len)`` is a programming error (`IndexError`); a damaged file is a
  `UserError` naming it.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np

from fleet.errors import UserError

if TYPE_CHECKING:  # annotations only
    from fleet.spec.sections import DataSpec


@dataclass(frozen=True)
class RawBatch:
    """Samples as read, before the pipeline.

    Attributes:
        items: a list of encoded images (`bytes`), or a uint8 NHWC array.
        labels: int64 array, one label per item.
        names: one identifier per item (a file path, ``file.h5[123]``) for error messages.
    """

    items: list[bytes] | np.ndarray
    labels: np.ndarray
    names: Sequence[str]

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def encoded(self) -> bool:
        """True when `items` holds encoded bytes that need decoding."""
        return not isinstance(self.items, np.ndarray)


class Reader(ABC):
    """A data set of labelled images; see the module docstring for the contract."""

    #: True when `read` returns encoded bytes (JPEG/PNG) rather than a uint8 NHWC array.
    encoded: bool = False
    #: The source type, as in `data.source` ("imagefolder", "hdf5", ...).
    source: str = ""
    #: True when `num_classes` is the largest label + 1 because nothing declared the count
    #: (`class_notices` tells the user).
    classes_inferred: bool = False

    @property
    @abstractmethod
    def num_classes(self) -> int:
        """Number of classes; labels lie in ``[0, num_classes)``."""

    @property
    @abstractmethod
    def labels(self) -> np.ndarray:
        """Every sample's label (int64, length `len(self)`), without decoding anything."""

    @abstractmethod
    def read(self, indices: np.ndarray) -> RawBatch:
        """Read the samples at `indices`, in that order."""

    @property
    def class_names(self) -> list[str]:
        """A name per class (folder names for image folders; the label as text otherwise)."""
        return [str(c) for c in range(self.num_classes)]

    @property
    def image_shape(self) -> tuple[int, int, int] | None:
        """(H, W, C) of every stored image, or None when images vary (encoded files)."""
        return None

    @property
    def where(self) -> str:
        """How messages name the data set: its file or folder, else its source."""
        return self.source

    def close(self) -> None:
        """Release open files; idempotent."""

    def __len__(self) -> int:
        return len(self.labels)

    def __enter__(self) -> "Reader":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def as_indices(indices: np.ndarray | Sequence[int], size: int) -> np.ndarray:
    """`indices` as an int64 array, checked against ``[0, size)``.

    Raises:
        IndexError: an index is out of range (a caller's bug, not a user's).
    """
    out = np.asarray(indices, dtype=np.int64).reshape(-1)
    if out.size and (out.min() < 0 or out.max() >= size):
        bad = out[(out < 0) | (out >= size)][0]
        raise IndexError(f"sample index {bad} out of range [0, {size})")
    return out


def check_declared_classes(declared: int | None, found: int, where: str, what: str) -> int:
    """The class count, after checking it against `data.classes` and the two-class minimum.

    Args:
        declared: `data.classes` from the spec (None: not declared).
        found: the number of classes the data holds.
        where: the file or folder the data came from, for messages.
        what: how the data holds them, e.g. "class folders" or "classes (labels 0..9)".

    Raises:
        UserError: fewer than 2 classes, or `declared` disagrees with `found`.
    """
    if found < 2:
        raise UserError(f"{where}: holds {found} {what}; a classifier needs at least 2")
    if declared is not None and declared != found:
        raise UserError(f"data.classes: {declared} declared, but {where} holds {found} {what}")
    return found


def class_notices(reader: Reader) -> list[str]:
    """What the user should hear about `reader`'s classes, one line each, starting with
    ``note:`` or ``warning:``: a class count inferred from the labels (nothing declared it),
    and most classes without a sample (every model gets an output per class all the same).
    The callers print them once per command or job (rank 0), prefixed with ``fleet:``."""
    classes, where = reader.num_classes, reader.where
    lines = []
    if reader.classes_inferred:
        lines.append(f"note: {where}: {classes} classes inferred from the labels (0..{classes - 1}); "
                     "set data.classes to say so")
    present = int(np.count_nonzero(np.bincount(reader.labels, minlength=classes)[:classes]))
    if 2 * present < classes:
        lines.append(f"warning: {where}: only {present} of {classes} classes have samples; every model gets "
                     f"{classes} outputs (are the labels numbered 0..{present - 1}?)")
    return lines


@dataclass(frozen=True)
class ReaderEntry:
    """How `open_reader` opens one `data.source` (each reader module's ``ENTRY``).

    Attributes:
        whole: ``(data, seed) -> Reader`` over the whole data set (`data` with its per-source
            defaults filled; `seed` the spec's).
        parts: ``(data, files, classes) -> Reader`` over some part files of a data set written
            by ``fleet data partition`` (`classes`: the whole set's class count); None where
            the source cannot be partitioned.
    """

    whole: Callable[[DataSpec, int], Reader]
    parts: Callable[[DataSpec, list[Path], int], Reader] | None = None


def data_path(data: DataSpec) -> Path:
    """The data set's path as the spec gives it, ``~`` expanded."""
    return Path(os.path.expanduser(str(data.path)))
