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


class GroupedImageFolderReader(ImageFolderReader):
    """Reads ``root/<group>/<class folder>/<image>`` (`data.group_by: directory`).

    The classes are the sorted union of every group's class-folder names (a group may lack
    some); samples come group by group in sorted order, each group's as `ImageFolderReader`'s.
    """

    def __init__(self, root: str | os.PathLike, declared_classes: int | None = None):
        self.root = Path(root)
        groups = class_folders(self.root)
        if not groups:
            raise UserError(f"{self.root}: no group folders (data.group_by: directory reads root/<group>/<class>/...)")
        by_group = {group.name: class_folders(group) for group in groups}
        names = sorted({folder.name for folders in by_group.values() for folder in folders})
        check_declared_classes(declared_classes, len(names), str(self.root), "class folders over the groups")
        label_of = {name: label for label, name in enumerate(names)}
        files, labels, keys = [], [], []
        for group, folders in by_group.items():
            before = len(files)
            for folder in folders:
                found = image_files(folder)
                files += found
                labels += [label_of[folder.name]] * len(found)
                keys += [group] * len(found)
            if len(files) == before:
                raise UserError(f"{self.root / group}: a group folder without images (root/<group>/<class>/*.jpg)")
        self._names, self._files, self._keys = names, files, keys
        self._labels = np.asarray(labels, dtype=np.int64)

    def group_keys(self, name: str | None = None, required: bool = True) -> list[str]:
        """Every sample's group: the folder it lies under (`name` is not read)."""
        return list(self._keys)


def _read_bytes(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise UserError(f"{path}: cannot read: {exc.strerror or exc.__class__.__name__}") from None


def open_imagefolder(data, seed: int) -> Reader:
    """The registry's opener: the folder at the spec's ``data.path`` (of group folders with
    ``data.group_by: directory``)."""
    kind = GroupedImageFolderReader if data.group_by == "directory" else ImageFolderReader
    return kind(data_path(data), data.classes)


ENTRY = ReaderEntry(open_imagefolder)
