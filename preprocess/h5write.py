"""Writing HDF5 shards in the layout `readers/hdf5.py` reads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

import h5py
import numpy as np

from fleet.errors import UserError
from preprocess.groups import GROUPS_DATASET
from preprocess.readers.hdf5 import H5_SUFFIXES, IMAGES, LABELS


def shard_targets(out: Path, shards: int, staging: Path | None = None) -> list[Path]:
    """Where `shards` shards go: `out` itself for one ``*.h5`` file, else ``out/shard-XXX.h5``.

    Args:
        out: the destination the user named.
        shards: the number of shards.
        staging: where they are written first (see `output.staged_output`); default `out`.
    """
    root = out if staging is None else staging
    if shards == 1 and out.suffix.lower() in H5_SUFFIXES:
        return [root]
    return [root / f"shard-{k:03d}.h5" for k in range(shards)]


def shard_sizes(total: int, shards: int, what: str = "--shards") -> list[int]:
    """Near-equal contiguous shard sizes; more shards than samples is a `UserError`."""
    if shards < 1 or shards > total:
        raise UserError(f"{what}: {shards} shards for {total} samples (expected 1..{total})")
    return [len(part) for part in np.array_split(np.arange(total), shards)]


class ShardWriter:
    """Append samples in order; they fill the shard files one after the other.

    Args:
        paths: the shard files to create.
        sizes: samples per shard (sums to the total that will be appended).
        image_shape: (H, W, C) of every image.
        classes: the data set's class count (attribute ``classes`` on every shard).
        class_names: optional names (attribute ``class_names``, JSON).
        attrs: further attributes for every shard.
        group_width: with group keys (`append`'s `groups`), their longest length in bytes.
        group_name: the dataset the group keys go into (default ``groups``).
    """

    def __init__(
        self,
        paths: Sequence[Path],
        sizes: Sequence[int],
        image_shape: tuple[int, int, int],
        classes: int,
        class_names: Sequence[str] | None = None,
        attrs: dict[str, Any] | None = None,
        group_width: int | None = None,
        group_name: str = GROUPS_DATASET,
    ):
        self._paths, self._sizes, self._shape = list(paths), list(sizes), tuple(image_shape)
        self._group_width, self._group_name = group_width, group_name
        self._attrs = {"classes": classes, **(attrs or {})}
        if class_names is not None:
            self._attrs["class_names"] = json.dumps(list(class_names))
        self._shard, self._filled, self._file = -1, 0, None

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """(H, W, C) of every image written."""
        return self._shape  # type: ignore[return-value]

    def append(self, images: np.ndarray, labels: np.ndarray, groups: Sequence[str] | None = None) -> None:
        """Write uint8 N x H x W x C `images` with their `labels` (and their `groups` keys,
        for a writer made with `group_width`) after the previous ones."""
        start = 0
        while start < len(images):
            if self._file is None or self._filled == self._sizes[self._shard]:
                self._next_file()
            take = min(len(images) - start, self._sizes[self._shard] - self._filled)
            at = slice(self._filled, self._filled + take)
            self._file[IMAGES][at] = images[start : start + take]
            self._file[LABELS][at] = labels[start : start + take]
            if self._group_width is not None:
                self._file[self._group_name][at] = np.asarray(groups[start : start + take], dtype=f"S{self._group_width}")
            self._filled += take
            start += take

    def _next_file(self) -> None:
        self.close()
        self._shard += 1
        if self._shard >= len(self._paths):
            raise ValueError("more samples appended than the shard sizes hold")
        path, size = self._paths[self._shard], self._sizes[self._shard]
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = h5py.File(path, "w")
        self._file.create_dataset(IMAGES, shape=(size, *self._shape), dtype=np.uint8)
        self._file.create_dataset(LABELS, shape=(size,), dtype=np.int64)
        if self._group_width is not None:
            self._file.create_dataset(self._group_name, shape=(size,), dtype=f"S{self._group_width}")
        self._file.attrs.update(self._attrs)
        self._filled = 0

    def close(self) -> None:
        """Close the open shard; idempotent."""
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> "ShardWriter":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
