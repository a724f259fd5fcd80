"""`source: hdf5`: one file or a directory of shards, each with datasets ``images`` and ``labels``.

Layout of a shard: ``images`` uint8 N x H x W x C (C = 1 or 3), ``labels`` integer (int64 as
fleet writes it) of length N. Optional attributes: ``classes`` (the class count of the whole
data set) and ``class_names`` (a JSON list). Shards of one data set share H, W and C; their
samples are numbered in shard-name order.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from fleet.errors import UserError
from preprocess.readers._base import RawBatch, Reader, ReaderEntry, as_indices, check_declared_classes, data_path

IMAGES = "images"
LABELS = "labels"
H5_SUFFIXES = (".h5", ".hdf5")
LAYOUT = f"expected datasets '{IMAGES}' (uint8, N x H x W x C, C 1 or 3) and '{LABELS}' (int64, N)"


def shard_files(path: str | os.PathLike) -> list[Path]:
    """The HDF5 files of a data set: `path` itself, or the ``*.h5``/``*.hdf5`` files in it, sorted.

    Raises:
        UserError: `path` is missing, or is a directory without HDF5 files.
    """
    path = Path(path)
    if not path.exists():
        raise UserError(f"{path}: no such file or directory")
    if not path.is_dir():
        return [path]
    shards = sorted(p for p in path.iterdir() if p.suffix.lower() in H5_SUFFIXES and not p.name.startswith("."))
    if not shards:
        raise UserError(f"{path}: no HDF5 shards (*.h5, *.hdf5) in this directory")
    return shards


def open_h5(path: str | os.PathLike) -> h5py.File:
    """Open an HDF5 file read-only; a missing, truncated or foreign file is a `UserError`."""
    try:
        return h5py.File(path, "r", locking=False)
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except OSError as exc:
        reason = str(exc).splitlines()[0] if str(exc) else exc.__class__.__name__
        raise UserError(f"{path}: not a readable HDF5 file ({reason})") from None


@dataclass(frozen=True)
class ShardInfo:
    """What opening a shard found: its size, image shape and optional class attributes."""

    path: Path
    count: int
    image_shape: tuple[int, int, int]
    classes: int | None
    class_names: list[str] | None


def _dataset(f: h5py.File, name: str, path: Path) -> h5py.Dataset:
    item = f.get(name)
    if not isinstance(item, h5py.Dataset):
        raise UserError(f"{path}: missing dataset '{name}' ({LAYOUT})")
    return item


def _check_images(images: h5py.Dataset, path: Path) -> tuple[int, int, int]:
    if images.dtype != np.uint8:
        raise UserError(f"{path}: dataset '{IMAGES}' has dtype {images.dtype}, expected uint8")
    if images.ndim != 4 or images.shape[3] not in (1, 3) or min(images.shape[1:3]) < 1:
        raise UserError(f"{path}: dataset '{IMAGES}' has shape {images.shape}, expected N x H x W x C with C 1 or 3")
    return tuple(int(v) for v in images.shape[1:])  # type: ignore[return-value]


def _check_labels(labels: h5py.Dataset, count: int, path: Path) -> np.ndarray:
    if labels.dtype.kind not in "iu":
        raise UserError(f"{path}: dataset '{LABELS}' has dtype {labels.dtype}, expected int64")
    if labels.ndim != 1 or labels.shape[0] != count:
        raise UserError(f"{path}: dataset '{LABELS}' has shape {labels.shape}, expected ({count},) like '{IMAGES}'")
    return labels[()].astype(np.int64, copy=False)


def _class_attrs(f: h5py.File, path: Path) -> tuple[int | None, list[str] | None]:
    classes = f.attrs.get("classes")
    names = f.attrs.get("class_names")
    try:
        classes = None if classes is None else int(classes)
        names = None if names is None else [str(n) for n in json.loads(names)]
    except (TypeError, ValueError):
        raise UserError(f"{path}: attributes 'classes'/'class_names' are malformed") from None
    return classes, names


def inspect_shard(path: Path) -> tuple[ShardInfo, np.ndarray]:
    """Validate one shard's layout and read its labels (images stay on disk).

    Raises:
        UserError: not HDF5, a missing dataset, a wrong dtype or shape.
    """
    with open_h5(path) as f:
        images = _dataset(f, IMAGES, path)
        shape = _check_images(images, path)
        labels = _check_labels(_dataset(f, LABELS, path), images.shape[0], path)
        classes, names = _class_attrs(f, path)
    return ShardInfo(path, len(labels), shape, classes, names), labels


def check_label_range(labels: np.ndarray, classes: int, path: Path) -> None:
    """Every label must lie in ``[0, classes)``; the first one that does not is named."""
    bad = np.flatnonzero((labels < 0) | (labels >= classes))
    if bad.size:
        i = int(bad[0])
        raise UserError(f"{path}: label {labels[i]} at index {i} is out of range (classes 0..{classes - 1})")


def _same_shapes(infos: list[ShardInfo]) -> None:
    first = infos[0]
    for info in infos[1:]:
        if info.image_shape != first.image_shape:
            (h, w, c), (fh, fw, fc) = info.image_shape, first.image_shape
            raise UserError(f"{info.path}: images are {h}x{w}x{c} but {first.path} holds {fh}x{fw}x{fc}")


def _class_count(infos: list[ShardInfo], labels: list[np.ndarray]) -> int:
    """The class count the files declare (attribute 'classes'), else the largest label + 1."""
    declared = sorted({info.classes for info in infos if info.classes is not None})
    if len(declared) > 1:
        raise UserError(f"{infos[0].path}: shards disagree on attribute 'classes' ({declared})")
    if declared:
        return declared[0]
    return max((int(lab.max()) for lab in labels if lab.size), default=-1) + 1


class HDF5Reader(Reader):
    """Reads uint8 NHWC images from HDF5 shards, opened lazily in the reading process.

    Args:
        paths: the shard files, in sample order.
        declared_classes: `data.classes` from the spec, checked against the files.
        num_classes: the class count when known from elsewhere (a partition manifest).
        where: how to name the data set in messages (default: the first shard).
    """

    source = "hdf5"

    def __init__(
        self,
        paths: list[Path],
        declared_classes: int | None = None,
        num_classes: int | None = None,
        where: str | None = None,
    ):
        inspected = [inspect_shard(Path(p)) for p in paths]
        infos = [info for info, _ in inspected]
        labels = [lab for _, lab in inspected]
        where = where or str(infos[0].path)
        _same_shapes(infos)
        if not sum(info.count for info in infos):
            raise UserError(f"{where}: holds no samples")
        found = num_classes if num_classes is not None else _class_count(infos, labels)
        self._classes = check_declared_classes(declared_classes, found, where, "classes")
        self.classes_inferred = declared_classes is None and num_classes is None and all(
            info.classes is None for info in infos
        )
        self._where = where
        for info, lab in zip(infos, labels):
            check_label_range(lab, self._classes, info.path)
        self._infos = infos
        self._labels = np.concatenate(labels)
        self._starts = np.cumsum([0] + [info.count for info in infos])[:-1]
        self._handles: dict[int, h5py.File] = {}
        self._pid = os.getpid()

    @property
    def num_classes(self) -> int:
        return self._classes

    @property
    def labels(self) -> np.ndarray:
        return self._labels

    @property
    def class_names(self) -> list[str]:
        names = self._infos[0].class_names
        return list(names) if names and len(names) == self._classes else super().class_names

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return self._infos[0].image_shape

    @property
    def where(self) -> str:
        return self._where

    @property
    def paths(self) -> list[Path]:
        """The shard files, in sample order."""
        return [info.path for info in self._infos]

    def group_keys(self, name: str, required: bool = True) -> list[str] | None:
        """Every sample's group key, from the 1-D dataset `name` of each shard (text or
        integers); None where the first shard has no such dataset and it is not `required`.

        Raises:
            UserError: a shard lacks it, or it is not one key per sample.
        """
        keys: list[str] = []
        for number, info in enumerate(self._infos):
            with open_h5(info.path) as f:
                if name not in f and number == 0 and not required:
                    return None
                if name not in f:
                    raise UserError(f"{info.path}: no dataset '{name}' of group keys (datasets: {', '.join(sorted(f))})")
                keys += _keys(f[name], info.count, info.path)
        return keys

    def read(self, indices: np.ndarray) -> RawBatch:
        idx = as_indices(indices, len(self._labels))
        shard_of = np.searchsorted(self._starts, idx, side="right") - 1
        out = np.empty((len(idx), *self.image_shape), dtype=np.uint8)
        for shard in np.unique(shard_of):
            at = np.flatnonzero(shard_of == shard)
            out[at] = self._read_shard(int(shard), idx[at] - self._starts[shard])
        names = [f"{self._infos[s].path}[{i - self._starts[s]}]" for s, i in zip(shard_of, idx)]
        return RawBatch(items=out, labels=self._labels[idx], names=names)

    def _read_shard(self, shard: int, local: np.ndarray) -> np.ndarray:
        """Images at shard-local indices (any order, repeats allowed), read in increasing order."""
        unique, inverse = np.unique(local, return_inverse=True)
        images = self._images(shard)
        try:
            if unique[-1] - unique[0] < 4 * len(unique):  # dense: one contiguous read
                block = images[unique[0] : unique[-1] + 1]
                return block[unique - unique[0]][inverse]
            return images[unique][inverse]
        except OSError as exc:
            raise UserError(f"{self._infos[shard].path}[{unique[0]}]: cannot read images ({exc})") from None

    def _images(self, shard: int) -> h5py.Dataset:
        if os.getpid() != self._pid:  # forked: never touch the parent's handles
            self._handles, self._pid = {}, os.getpid()
        if shard not in self._handles:
            self._handles[shard] = open_h5(self._infos[shard].path)
        return self._handles[shard][IMAGES]

    def close(self) -> None:
        if os.getpid() == self._pid:
            for handle in self._handles.values():
                handle.close()
        self._handles = {}

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_handles"] = {}
        return state


def _keys(dataset: h5py.Dataset, count: int, path: Path) -> list[str]:
    """A shard's group keys as text: one per sample, bytes, text or integers."""
    if dataset.shape != (count,):
        raise UserError(f"{path}: dataset '{dataset.name.lstrip('/')}' has shape {dataset.shape}, expected ({count},) "
                        "group keys, one per sample")
    kind = dataset.dtype.kind
    if kind == "i" or kind == "u":
        return [str(int(k)) for k in dataset[()]]
    if kind == "S" or h5py.check_string_dtype(dataset.dtype) is not None:
        try:
            return [k.decode("utf-8") if isinstance(k, bytes) else str(k) for k in dataset[()]]
        except UnicodeDecodeError:
            raise UserError(f"{path}: dataset '{dataset.name.lstrip('/')}': group keys are not UTF-8 text") from None
    raise UserError(f"{path}: dataset '{dataset.name.lstrip('/')}' has dtype {dataset.dtype}, expected text or "
                    "integer group keys")


def open_hdf5(data, seed: int) -> Reader:
    """The registry's opener: the shards at the spec's ``data.path``."""
    return HDF5Reader(shard_files(data_path(data)), data.classes, where=str(data_path(data)))


def open_hdf5_parts(data, files: list[Path], classes: int) -> Reader:
    """The registry's opener of some partitions (`files`) of a data set of `classes` classes."""
    return HDF5Reader(files, data.classes, num_classes=classes, where=str(data_path(data)))


ENTRY = ReaderEntry(open_hdf5, parts=open_hdf5_parts)
