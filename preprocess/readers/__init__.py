"""Dataset readers, one module per `data.source`, found by name in `READERS`.

`open_reader` looks the spec's `data.source` up in `READERS` and opens its reader. The names
themselves are the spec's `Source` enum (the one list: the spec validates `data.source`
against it without importing the readers); every name has one entry here, and a test keeps
the two equal. To add a reader: a module with a `Reader` subclass (see `_base.py`), a name
in `Source`, and one `ReaderEntry` below.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fleet.errors import UserError
from fleet.spec.sections import DataSpec, Source
from preprocess.generator import SyntheticRecipe
from preprocess.layout import part_name, read_manifest
from preprocess.readers._base import RawBatch, Reader, class_notices
from preprocess.readers.digits import DigitsReader
from preprocess.readers.hdf5 import HDF5Reader, shard_files
from preprocess.readers.imagefolder import ImageFolderReader
from preprocess.readers.synthetic import SyntheticReader

__all__ = [
    "READERS", "RawBatch", "Reader", "ReaderEntry", "class_notices", "open_reader", "partition_count",
    "partition_manifest", "reader_entry",
]


def _path(data: DataSpec) -> Path:
    return Path(os.path.expanduser(str(data.path)))


def _synthetic(data: DataSpec, seed: int) -> Reader:
    return SyntheticReader(SyntheticRecipe(data.classes, data.image_size, data.channels, seed), data.samples)


def _imagefolder(data: DataSpec, seed: int) -> Reader:
    return ImageFolderReader(_path(data), data.classes)


def _hdf5(data: DataSpec, seed: int) -> Reader:
    return HDF5Reader(shard_files(_path(data)), data.classes, where=str(_path(data)))


def _hdf5_parts(data: DataSpec, files: list[Path], classes: int) -> Reader:
    return HDF5Reader(files, data.classes, num_classes=classes, where=str(_path(data)))


def _digits(data: DataSpec, seed: int) -> Reader:
    return DigitsReader(data.classes)


@dataclass(frozen=True)
class ReaderEntry:
    """How `open_reader` opens one `data.source`.

    Attributes:
        whole: ``(data, seed) -> Reader`` over the whole data set (`data` with its per-source
            defaults filled; `seed` the spec's).
        parts: ``(data, files, classes) -> Reader`` over some part files of a data set written
            by ``fleet data partition`` (`classes`: the whole set's class count); None where
            the source cannot be partitioned.
    """

    whole: Callable[[DataSpec, int], Reader]
    parts: Callable[[DataSpec, list[Path], int], Reader] | None = None


READERS: dict[Source, ReaderEntry] = {
    Source.SYNTHETIC: ReaderEntry(_synthetic),
    Source.IMAGEFOLDER: ReaderEntry(_imagefolder),
    Source.HDF5: ReaderEntry(_hdf5, parts=_hdf5_parts),
    Source.DIGITS: ReaderEntry(_digits),
}
"""The reader of each `data.source`."""


def reader_entry(source: Source | str) -> ReaderEntry:
    """The registry entry of `source` (a `Source` or its name).

    Raises:
        UserError: no reader has that name; the message lists the valid ones.
    """
    try:
        return READERS[Source(source)]
    except (ValueError, KeyError):
        name = getattr(source, "value", source)
        valid = ", ".join(s.value for s in READERS)
        raise UserError(f"data.source: no reader for {name!r}; valid: {valid}") from None


def partition_count(data: DataSpec) -> int:
    """How many partitions `data` has: the manifest's count when partitioned, else 1."""
    return partition_manifest(data).count if data.partitioned else 1


def partition_manifest(data: DataSpec):
    """The `PartitionManifest` of partitioned `data` (its source must read parts).

    Raises:
        UserError: the source cannot be partitioned, or the manifest is missing or malformed.
    """
    _parts_opener(data)
    return read_manifest(_path(data))


def _parts_opener(data: DataSpec) -> Callable[[DataSpec, list[Path], int], Reader]:
    """The `parts` factory of `data.source`; a source without one cannot be partitioned."""
    parts = reader_entry(data.source).parts
    if parts is None:
        able = " or ".join(repr(s.value) for s, entry in READERS.items() if entry.parts is not None)
        raise UserError(
            f"data.partitioned: source {data.source.value!r} cannot be partitioned; "
            f"use source {able} with a directory written by: fleet data partition"
        )
    return parts


def _open_partition(data: DataSpec, partition: int | None) -> Reader:
    parts = _parts_opener(data)
    root = _path(data)
    manifest = read_manifest(root)
    if partition is not None and not 0 <= partition < manifest.count:
        raise IndexError(f"partition {partition} out of range: {root} has {manifest.count} partitions")
    indices = range(manifest.count) if partition is None else [partition]
    return parts(data, [root / part_name(k) for k in indices], manifest.classes)


def open_reader(data: DataSpec, seed: int = 0, partition: int | None = None) -> Reader:
    """Open the reader for `data` in this process (files open lazily on the first read).

    Args:
        data: the spec's data section (per-source defaults are filled here).
        seed: the spec's seed; it determines the `synthetic` source's images.
        partition: with `data.partitioned`, the partition to open (None: all parts as one
            data set). Without it, only None or 0 (the whole data set) are valid.

    Returns:
        A `Reader`; close it (or use it as a context manager) when done.

    Raises:
        UserError: the data set is missing, malformed, or disagrees with `data`.
    """
    data = data.defaults_filled()
    if data.partitioned:
        return _open_partition(data, partition)
    if partition not in (None, 0):
        raise IndexError(f"partition {partition} requested, but data.partitioned is false (1 partition)")
    return reader_entry(data.source).whole(data, seed)
