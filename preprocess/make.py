"""`fleet data make synthetic`: write the synthetic data set as a JPEG image folder or HDF5 shards.

The images are those of `source: synthetic` (`generator.draw_sample`); the JPEG folder
additionally passes them through JPEG compression, as a real image folder would. With
``groups``, HDF5 shards also hold each sample's group key (dataset ``groups``: ``g000``, ...),
the group sizes Zipf-skewed (`preprocess.groups.zipf_sizes`) and the groups drawn over the
samples in a seeded order.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import numpy as np
from PIL import Image
from tqdm import tqdm

from fleet.errors import UserError
from preprocess.generator import SyntheticRecipe, draw_samples, sample_labels
from preprocess.groups import group_key_names, zipf_sizes
from preprocess.seeding import rng_for
from preprocess.h5write import ShardWriter, shard_sizes, shard_targets
from preprocess.output import progress_bar, staged_output

FORMATS = ("jpeg", "hdf5")
JPEG_QUALITY = 90
BATCH = 256
_GROUPS_TAG = 0x6209  # separates the order of the groups from the images' streams


def class_folder_name(label: int) -> str:
    """The folder of class `label`, e.g. ``003.class3`` (sorted order is label order)."""
    return f"{label:03d}.class{label}"


def _check_args(fmt: str, recipe: SyntheticRecipe, samples: int, shards: int) -> None:
    if fmt not in FORMATS:
        raise UserError(f"--format: expected one of {', '.join(FORMATS)}, got {fmt!r}")
    if recipe.classes < 2:
        raise UserError(f"--classes: expected at least 2, got {recipe.classes}")
    if samples < recipe.classes:
        raise UserError(f"--samples: {samples} samples cannot cover {recipe.classes} classes")
    if min(recipe.image_size) < 1:
        raise UserError(f"--image-size: expected a positive size, got {recipe.image_size}")
    if recipe.channels not in (1, 3):
        raise UserError(f"--channels: expected 1 or 3, got {recipe.channels}")
    if fmt == "jpeg" and shards != 1:
        raise UserError("--shards: applies to --format hdf5 only")
    if fmt == "hdf5":
        shard_sizes(samples, shards)


def _check_groups(fmt: str, groups: int | None, skew: float, samples: int) -> None:
    if groups is None:
        return
    if fmt != "hdf5":
        raise UserError("--groups: --format hdf5 only (the group keys are a dataset beside the labels)")
    if groups < 1:
        raise UserError(f"--groups: expected at least 1, got {groups}")
    if not skew >= 0:
        raise UserError(f"--group-skew: expected a Zipf exponent >= 0, got {skew}")
    if samples < groups:
        raise UserError(f"--groups: {groups} groups need at least {groups} samples, got --samples {samples}")


def sample_groups(samples: int, groups: int, skew: float, seed: int) -> list[str]:
    """Each sample's group key: Zipf-skewed sizes (exponent `skew`), in a seeded order."""
    names = group_key_names(groups)
    owners = np.repeat(np.arange(groups), zipf_sizes(samples, groups, skew))
    return [names[k] for k in rng_for(seed, _GROUPS_TAG, groups).permutation(owners)]


def _batches(recipe: SyntheticRecipe, samples: int, bar: tqdm) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    for start in range(0, samples, BATCH):
        indices = np.arange(start, min(start + BATCH, samples))
        yield indices, draw_samples(recipe, indices)
        bar.update(len(indices))


def _write_jpeg_folder(root: Path, recipe: SyntheticRecipe, samples: int, bar: tqdm) -> None:
    folders = [root / class_folder_name(c) for c in range(recipe.classes)]
    for folder in folders:
        folder.mkdir(parents=True)
    for indices, images in _batches(recipe, samples, bar):
        for index, image in zip(indices, images):
            pixels = Image.fromarray(image[..., 0] if image.shape[2] == 1 else image)
            pixels.save(folders[index % recipe.classes] / f"{index:06d}.jpg", quality=JPEG_QUALITY)


def _write_hdf5(out: Path, staging: Path, recipe: SyntheticRecipe, samples: int, shards: int, bar: tqdm,
                groups: list[str] | None = None) -> None:
    names = [class_folder_name(c) for c in range(recipe.classes)]
    shape = (*recipe.image_size, recipe.channels)
    attrs = {"source": "fleet data make synthetic", "seed": recipe.seed}
    targets = shard_targets(out, shards, staging)
    width = max(map(len, groups)) if groups else None
    with ShardWriter(targets, shard_sizes(samples, shards), shape, recipe.classes, names, attrs, width) as writer:
        for indices, images in _batches(recipe, samples, bar):
            keys = [groups[i] for i in indices] if groups else None
            writer.append(images, sample_labels(indices, recipe.classes), keys)


def make_synthetic(
    out: str | os.PathLike,
    fmt: str,
    classes: int = 10,
    samples: int = 2000,
    image_size: int | tuple[int, int] = 32,
    channels: int = 3,
    seed: int = 0,
    shards: int = 1,
    progress: bool = True,
    force: bool = False,
    groups: int | None = None,
    group_skew: float = 1.0,
) -> Path:
    """Write `samples` synthetic images of `classes` classes to `out`.

    Args:
        out: the destination: a directory (``jpeg``: one folder per class; ``hdf5``:
            ``shard-XXX.h5`` files), or a ``*.h5`` file for one HDF5 shard.
        fmt: ``"jpeg"`` or ``"hdf5"``.
        classes: number of classes (sample i has label ``i % classes``).
        samples: number of images.
        image_size: side of square images, or (H, W).
        channels: 3 (RGB) or 1 (grey).
        seed: the generator's seed (the same as `source: synthetic` with this spec seed).
        shards: number of HDF5 shards.
        progress: show a progress bar on stderr (on a terminal).
        force: replace an existing, non-empty `out`.
        groups: with a number, that many groups (``hdf5`` only), sizes Zipf-skewed by `group_skew`.
        group_skew: the Zipf exponent of the group sizes (0: equal groups).

    Returns:
        `out` as a Path.

    Raises:
        UserError: a bad argument, or `out` exists and is not empty without `force`.
    """
    size = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
    recipe = SyntheticRecipe(classes, size, channels, seed)
    _check_args(fmt, recipe, samples, shards)
    _check_groups(fmt, groups, group_skew, samples)
    keys = sample_groups(samples, groups, group_skew, seed) if groups else None
    out = Path(out)
    with staged_output(out, force) as staging, progress_bar(samples, "make synthetic", progress) as bar:
        if fmt == "jpeg":
            _write_jpeg_folder(staging, recipe, samples, bar)
        else:
            _write_hdf5(out, staging, recipe, samples, shards, bar, keys)
    return out
