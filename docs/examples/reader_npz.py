"""Example: a dataset reader for images stored in one ``.npz`` file (arrays ``images``, uint8
NHWC, and ``labels``, integers).

A reader is (see docs/architecture.md, "Adding a dataset reader"):
1. a `preprocess.readers.Reader` subclass (the contract is in `preprocess/readers/_base.py`:
   cheap metadata, `read(indices)` in order, a damaged file is a `UserError` naming it);
2. its name in the spec's `Source` enum (`fleet/spec/sections.py`, the one list of names);
3. its module's ``ENTRY``, a `ReaderEntry` that opens it from the spec's `data`, named in
   `preprocess.readers.READERS` (``"npz": "package.module:ENTRY"``: imported on first use).
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np

from fleet.errors import UserError
from preprocess.readers import RawBatch, Reader, ReaderEntry
from preprocess.readers._base import as_indices, check_declared_classes


class NpzReader(Reader):
    """Images and labels from one ``.npz`` file, loaded once (never unpickled)."""

    encoded = False
    source = "npz"

    def __init__(self, path: str | Path, classes: int | None = None):
        self.path = Path(path)
        try:
            with np.load(self.path, allow_pickle=False) as arrays:
                self.images, labels = arrays["images"], arrays["labels"]
        except (OSError, KeyError, ValueError, zipfile.BadZipFile) as exc:
            raise UserError(f"{self.path}: not an .npz of 'images' and 'labels': {exc}") from None
        if self.images.dtype != np.uint8 or self.images.ndim != 4 or len(labels) != len(self.images):
            raise UserError(f"{self.path}: expected uint8 images (N, H, W, C) and one label per image")
        self._labels = labels.astype(np.int64)
        found = int(self._labels.max()) + 1 if len(self._labels) else 0
        self._classes = check_declared_classes(classes, found, str(self.path), f"classes (labels 0..{found - 1})")

    @property
    def num_classes(self) -> int:
        return self._classes

    @property
    def labels(self) -> np.ndarray:
        return self._labels

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return tuple(int(d) for d in self.images.shape[1:])

    def read(self, indices) -> RawBatch:
        indices = as_indices(indices, len(self))
        return RawBatch(self.images[indices], self._labels[indices], [f"{self.path}[{i}]" for i in indices])


def open_npz(data, seed: int) -> Reader:
    """The registry's opener: the spec's ``data`` (its ``path`` and ``classes``) -> a reader."""
    return NpzReader(data.path, data.classes)


ENTRY = ReaderEntry(open_npz)
"""What `READERS` names under the new `Source` name (``"npz": "docs.examples.reader_npz:ENTRY"``)."""
