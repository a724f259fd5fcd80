"""Dataset readers, one module per `data.source`; `open_reader` picks one from a `DataSpec`."""

from __future__ import annotations

import os
from pathlib import Path

from fleet.errors import UserError
from fleet.spec.sections import DataSpec, Source
from preprocess.layout import part_name, read_manifest
from preprocess.readers._base import RawBatch, Reader

__all__ = ["RawBatch", "Reader", "open_reader", "partition_count"]


def _path(data: DataSpec) -> Path:
    return Path(os.path.expanduser(str(data.path)))


def partition_count(data: DataSpec) -> int:
    """How many partitions `data` has: the manifest's count when partitioned, else 1."""
    if not data.partitioned:
        return 1
    _check_partitionable(data)
    return read_manifest(_path(data)).count


def _check_partitionable(data: DataSpec) -> None:
    if data.source is not Source.HDF5:
        raise UserError(
            f"data.partitioned: source {data.source.value!r} cannot be partitioned; "
            "use source 'hdf5' with a directory written by: fleet data partition"
        )


def _open_partition(data: DataSpec, partition: int | None) -> Reader:
    from preprocess.readers.hdf5 import HDF5Reader

    _check_partitionable(data)
    root = _path(data)
    manifest = read_manifest(root)
    if partition is not None and not 0 <= partition < manifest.count:
        raise IndexError(f"partition {partition} out of range: {root} has {manifest.count} partitions")
    parts = range(manifest.count) if partition is None else [partition]
    files = [root / part_name(k) for k in parts]
    return HDF5Reader(files, data.classes, num_classes=manifest.classes, where=str(root))


def _open_whole(data: DataSpec, seed: int) -> Reader:
    if data.source is Source.SYNTHETIC:
        from preprocess.generator import SyntheticRecipe
        from preprocess.readers.synthetic import SyntheticReader

        recipe = SyntheticRecipe(data.classes, data.image_size, data.channels, seed)
        return SyntheticReader(recipe, data.samples)
    if data.source is Source.IMAGEFOLDER:
        from preprocess.readers.imagefolder import ImageFolderReader

        return ImageFolderReader(_path(data), data.classes)
    if data.source is Source.HDF5:
        from preprocess.readers.hdf5 import HDF5Reader, shard_files

        return HDF5Reader(shard_files(_path(data)), data.classes, where=str(_path(data)))
    from preprocess.readers.digits import DigitsReader

    return DigitsReader(data.classes)


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
    return _open_whole(data, seed)
