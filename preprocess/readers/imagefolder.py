"""`source: imagefolder`: one folder per class (as Caltech256 ships: ``001.ak47/...jpg``)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from fleet.errors import UserError
from preprocess.readers._base import RawBatch, Reader, ReaderEntry, as_indices, check_declared_classes, data_path

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")


def _visible(entry: os.DirEntry) -> bool:
    return not entry.name.startswith(".")


def class_folders(root: Path) -> list[Path]:
    """The class folders under `root`, sorted by name (hidden folders skipped).

    Raises:
        UserError: `root` is missing or not a directory.
    """
    if not root.exists():
        raise UserError(f"{root}: no such directory")
    if not root.is_dir():
        raise UserError(f"{root}: not a directory (an image folder holds one folder per class)")
    with os.scandir(root) as entries:
        return sorted(Path(e.path) for e in entries if _visible(e) and e.is_dir())


def image_files(folder: Path) -> list[str]:
    """The JPEG/PNG files in a class folder, sorted by name."""
    with os.scandir(folder) as entries:
        return sorted(
            e.path
            for e in entries
            if _visible(e) and e.is_file() and e.name.lower().endswith(IMAGE_SUFFIXES)
        )


class ImageFolderReader(Reader):
    """Reads encoded JPEG/PNG files from ``root/<class folder>/<image>``.

    Labels follow the sorted class-folder names. Only the directory listing happens on
    open; `read` returns the file bytes (the pipeline's decode op decodes them).
    """

    encoded = True
    source = "imagefolder"

    def __init__(self, root: str | os.PathLike, declared_classes: int | None = None):
        self.root = Path(root)
        folders = class_folders(self.root)
        check_declared_classes(declared_classes, len(folders), str(self.root), "class folders")
        files, labels = [], []
        for label, folder in enumerate(folders):
            found = image_files(folder)
            if not found:
                raise UserError(f"{folder}: empty class folder (no .jpg, .jpeg or .png files)")
            files += found
            labels += [label] * len(found)
        self._names = [f.name for f in folders]
        self._files = files
        self._labels = np.asarray(labels, dtype=np.int64)

    @property
    def num_classes(self) -> int:
        return len(self._names)

    @property
    def labels(self) -> np.ndarray:
        return self._labels

    @property
    def class_names(self) -> list[str]:
        return list(self._names)

    @property
    def where(self) -> str:
        return str(self.root)

    @property
    def files(self) -> list[str]:
        """Every image's path, in sample order."""
        return list(self._files)

    def read(self, indices: np.ndarray) -> RawBatch:
        idx = as_indices(indices, len(self._files))
        names = [self._files[i] for i in idx]
        return RawBatch(items=[_read_bytes(name) for name in names], labels=self._labels[idx], names=names)


def _read_bytes(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise UserError(f"{path}: cannot read: {exc.strerror or exc.__class__.__name__}") from None


def open_imagefolder(data, seed: int) -> Reader:
    """The registry's opener: the folder at the spec's ``data.path``."""
    return ImageFolderReader(data_path(data), data.classes)


ENTRY = ReaderEntry(open_imagefolder)
