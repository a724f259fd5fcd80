"""`fleet data info`: what a data set holds (source, size, image shape, samples per class)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from PIL import Image

from fleet.errors import UserError
from fleet.spec import load_spec
from preprocess.groups import GROUPS_DATASET, group_sizes
from preprocess.layout import PartitionManifest, is_partitioned, part_name, read_manifest
from preprocess.readers import Reader, open_reader
from preprocess.readers.hdf5 import H5_SUFFIXES, HDF5Reader, shard_files
from preprocess.readers.imagefolder import ImageFolderReader

SPEC_SUFFIXES = (".yaml", ".yml")


def open_path(path: str | os.PathLike) -> tuple[Reader, PartitionManifest | None]:
    """Open a data set named by its path, guessing its kind from what is there.

    A partition directory (with ``partitions.json``), an HDF5 file, a directory of HDF5
    shards, or an image folder. Returns the reader and, for partitions, the manifest.
    """
    root = Path(path)
    if not root.exists():
        raise UserError(f"{path}: no such file or directory")
    if is_partitioned(root):
        manifest = read_manifest(root)
        files = [root / part_name(k) for k in range(manifest.count)]
        return HDF5Reader(files, num_classes=manifest.classes, where=str(root)), manifest
    if root.is_file() or any(p.suffix.lower() in H5_SUFFIXES for p in root.iterdir()):
        return HDF5Reader(shard_files(root), where=str(root)), None
    return ImageFolderReader(root), None


def open_spec(path: str | os.PathLike) -> tuple[Reader, PartitionManifest | None]:
    """Open the data set of a spec file (`data` section, spec seed)."""
    spec = load_spec(path)
    manifest = read_manifest(spec.data.path) if spec.data.partitioned else None
    return open_reader(spec.data, seed=spec.seed), manifest


def open_any(path_or_spec: str) -> tuple[Reader, PartitionManifest | None]:
    """`open_spec` for ``*.yaml``/``*.yml`` files, `open_path` for anything else."""
    if Path(path_or_spec).suffix.lower() in SPEC_SUFFIXES:
        return open_spec(path_or_spec)
    return open_path(path_or_spec)


def _shape_line(reader: Reader, lenient: bool) -> str:
    if reader.image_shape is not None:
        h, w, c = reader.image_shape
        return f"{h}x{w}x{c} (HxWxC, uint8)"
    if isinstance(reader, ImageFolderReader):
        first = reader.files[0]
        try:
            with Image.open(first) as image:
                return f"varies (encoded files; the first is {image.height}x{image.width} {image.mode}: {first})"
        except OSError:
            if lenient:
                return f"varies (encoded files; the first cannot be decoded: {first})"
            raise UserError(f"{first}: cannot decode image (not a JPEG/PNG file)") from None
    return "varies"


def describe(reader: Reader, where: str, manifest: PartitionManifest | None = None, lenient: bool = False) -> str:
    """A few lines about `reader`'s data set, then one line per class.

    `lenient`: a first image that cannot be decoded is said in the shape line instead of
    raising (`--check` then names every bad file)."""
    counts = np.bincount(reader.labels, minlength=reader.num_classes)
    lines = [
        f"source:       {reader.source}{' (partitioned)' if manifest else ''}",
        f"path:         {where}",
        f"samples:      {len(reader)}",
        f"classes:      {reader.num_classes}",
        f"image shape:  {_shape_line(reader, lenient)}",
    ]
    if manifest is not None:
        sizes = ", ".join(str(s) for s in manifest.sizes)
        lines.append(f"partitions:   {manifest.count} (samples per part: {sizes}; seed {manifest.seed})")
    width = max([len("class")] + [len(name) for name in reader.class_names])
    lines.append(f"{'label':>5}  {'class':<{width}}  samples")
    lines += [f"{c:>5}  {name:<{width}}  {n}" for c, (name, n) in enumerate(zip(reader.class_names, counts))]
    return "\n".join(lines)


def group_lines(reader: Reader, name: str | None, manifest: PartitionManifest | None = None) -> list[str]:
    """The groups of a grouped data set and their sizes, largest first: those of the dataset
    `name` (`--group-by`), else of a ``groups`` dataset where the data set has one; none else.
    Of data partitioned by those groups (`manifest`), each group's parts too.

    Raises:
        UserError: `name` is given and the data set has no such group keys.
    """
    if not isinstance(reader, HDF5Reader):
        if name is not None:
            raise UserError(f"--group-by {name}: group keys are a dataset of HDF5 data sets; {reader.where} is "
                            f"{reader.source}")
        return []
    keys = reader.group_keys(name or GROUPS_DATASET, required=name is not None)
    if keys is None:
        return []
    sizes = group_sizes(keys)
    width = max(len("group"), *(len(k) for k, _ in sizes))
    parts = manifest.group_parts() if manifest is not None and manifest.group_by == (name or GROUPS_DATASET) else {}
    lines = [f"groups:       {len(sizes)} (dataset '{name or GROUPS_DATASET}'; largest {sizes[0][1]}, "
             f"smallest {sizes[-1][1]} samples)", f"{'group':<{width}}  samples" + ("  parts" if parts else "")]
    if parts:
        return lines + [f"{key:<{width}}  {count:<7}  {', '.join(map(str, parts.get(key, ())))}" for key, count in sizes]
    return lines + [f"{key:<{width}}  {count}" for key, count in sizes]
