"""Dataset readers, one module per `data.source`, found by name in `READERS`.

`open_reader` looks the spec's `data.source` up in `READERS` and opens its reader. The names
themselves are the spec's `Source` enum (the one list: the spec validates `data.source`
against it without importing the readers); every name has one entry here, and a test keeps
the two equal. Like the engines' frameworks, a reader's module is imported the first time
its source is opened (`fleet.registry.Registry`): importing this package imports neither
h5py nor Pillow. To add a reader: a module with a `Reader` subclass (see `_base.py`) and its
``ENTRY`` (a `ReaderEntry`), a name in `Source`, and one line in `READERS` below.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from fleet.errors import UserError
from fleet.registry import Registry
from fleet.spec.sections import DataSpec, Source
from preprocess.layout import part_name, read_manifest
from preprocess.readers._base import RawBatch, Reader, ReaderEntry, class_notices, data_path

__all__ = [
    "READERS", "RawBatch", "Reader", "ReaderEntry", "class_notices", "open_reader", "partition_count",
    "partition_manifest", "reader_entry",
]

READERS: Registry[ReaderEntry] = Registry("data.source", {
    Source.SYNTHETIC.value: "preprocess.readers.synthetic:ENTRY",
    Source.IMAGEFOLDER.value: "preprocess.readers.imagefolder:ENTRY",
    Source.HDF5.value: "preprocess.readers.hdf5:ENTRY",
    Source.DIGITS.value: "preprocess.readers.digits:ENTRY",
})
"""The reader of each `data.source`, by name: its module's ``ENTRY``, imported on first use."""


def reader_entry(source: Source | str) -> ReaderEntry:
    """The registry entry of `source` (a `Source` or its name), its module imported on first use.

    Raises:
        UserError: no reader has that name; the message lists the valid ones.
    """
    name = getattr(source, "value", source)
    if name not in READERS:
        raise UserError(f"data.source: no reader for {name!r}; valid: {', '.join(READERS.names)}")
    return READERS.load(name)


def partition_count(data: DataSpec) -> int:
    """How many partitions `data` has: the manifest's count when partitioned, else 1."""
    return partition_manifest(data).count if data.partitioned else 1


def partition_manifest(data: DataSpec):
    """The `PartitionManifest` of partitioned `data` (its source must read parts).

    Raises:
        UserError: the source cannot be partitioned, or the manifest is missing or malformed.
    """
    _parts_opener(data)
    return read_manifest(data_path(data))


def _parts_opener(data: DataSpec) -> Callable[[DataSpec, list[Path], int], Reader]:
    """The `parts` factory of `data.source`; a source without one cannot be partitioned."""
    parts = reader_entry(data.source).parts
    if parts is None:
        able = " or ".join(repr(name) for name in READERS.names if READERS.load(name).parts is not None)
        raise UserError(
            f"data.partitioned: source {data.source.value!r} cannot be partitioned; "
            f"use source {able} with a directory written by: fleet data partition"
        )
    return parts


def _open_partition(data: DataSpec, partition: int | None) -> Reader:
    parts = _parts_opener(data)
    root = data_path(data)
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
