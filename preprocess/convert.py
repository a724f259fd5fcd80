"""`fleet data convert`: an image folder -> HDF5 shards of fixed-size uint8 images.

Decoding the folder once at convert time makes every later epoch a plain array read.
Each image is decoded (JPEG at a reduced scale when much larger than the target) and resized
bilinearly to the target size, like the pipeline's ``decode`` + ``resize`` ops.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from fleet.errors import UserError
from preprocess.h5write import ShardWriter, shard_sizes, shard_targets
from preprocess.output import progress_bar, staged_output
from preprocess.readers.imagefolder import ImageFolderReader
from preprocess.transforms import decode_image, resize_image

BATCH = 256


def decode_resized(data: list[bytes], names: list[str], size: tuple[int, int], channels: int) -> np.ndarray:
    """Decode encoded images and resize each to `size`: uint8 N x H x W x `channels`."""
    return np.stack([resize_image(decode_image(b, n, channels, size), size) for b, n in zip(data, names)])


def _size_pair(image_size: int | tuple[int, int]) -> tuple[int, int]:
    size = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
    if len(size) != 2 or min(size) < 1:
        raise UserError(f"--image-size: expected a positive size, got {image_size}")
    return size  # type: ignore[return-value]


def convert_folder(
    src: str | os.PathLike,
    out: str | os.PathLike,
    image_size: int | tuple[int, int],
    shards: int = 1,
    channels: int = 3,
    progress: bool = True,
    force: bool = False,
) -> Path:
    """Convert the image folder `src` to HDF5 at `out`.

    Args:
        src: a directory with one folder per class (see `readers/imagefolder.py`).
        out: a ``*.h5`` file (one shard) or a directory for ``shard-XXX.h5`` files.
        image_size: the stored size: a side, or (H, W).
        shards: number of shards (contiguous runs of samples in class order).
        channels: 3 (RGB) or 1 (grey).
        progress: show a progress bar on stderr (on a terminal).
        force: replace an existing, non-empty `out`.

    Returns:
        `out` as a Path.

    Raises:
        UserError: a missing or malformed folder, a corrupt image (named), a bad argument.
    """
    size = _size_pair(image_size)
    if channels not in (1, 3):
        raise UserError(f"--channels: expected 1 or 3, got {channels}")
    reader = ImageFolderReader(src)
    sizes = shard_sizes(len(reader), shards)
    out = Path(out)
    attrs = {"source": str(Path(src).resolve())}
    with staged_output(out, force, inputs=[Path(src)]) as staging:
        targets = shard_targets(out, shards, staging)
        shape = (*size, channels)
        with ShardWriter(targets, sizes, shape, reader.num_classes, reader.class_names, attrs) as writer:
            _convert_into(reader, writer, size, progress)
    return out


def _convert_into(reader: ImageFolderReader, writer: ShardWriter, size: tuple[int, int], progress: bool) -> None:
    """Decode, resize and append every image of `reader`, in sample order."""
    with progress_bar(len(reader), "convert", progress) as bar:
        for start in range(0, len(reader), BATCH):
            raw = reader.read(np.arange(start, min(start + BATCH, len(reader))))
            writer.append(decode_resized(raw.items, list(raw.names), size, writer.image_shape[2]), raw.labels)
            bar.update(len(raw))
