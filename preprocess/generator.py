"""The synthetic image generator shared by `source: synthetic` and `fleet data make synthetic`.

Sample ``i`` of a recipe is a function of (seed, i) only. Its class is ``i % classes``. Each
class has a *style*: a foreground and a background colour, an oriented grating (angle and
spatial frequency) and a coloured blob at a home position. A sample draws around its class
style: colour jitter, grating phase, angle and frequency jitter, contrast, blob position and
size jitter, brightness and pixel noise. Colours overlap between classes and a horizontal flip
mirrors the angle, so neither colour nor orientation alone separates the classes: a small CNN
learns them within a few epochs, a linear model on pixels does well above chance, and neither
is perfect after one epoch.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from preprocess.seeding import rng_for

_STYLE_TAG = 0x5717E  # separates the class-style stream from the sample streams
_SAMPLE_TAG = 0x5A3B1E
_LUMA = np.array([0.299, 0.587, 0.114], dtype=np.float32)


@dataclass(frozen=True)
class SyntheticRecipe:
    """What a synthetic data set is: `classes` x (`image_size` H, W) x `channels`, from `seed`."""

    classes: int = 10
    image_size: tuple[int, int] = (32, 32)
    channels: int = 3
    seed: int = 0


@dataclass(frozen=True)
class ClassStyles:
    """Per-class parameters, each an array with one row per class."""

    foreground: np.ndarray  # (K, 3) RGB in [0, 1]
    background: np.ndarray  # (K, 3)
    blob_colour: np.ndarray  # (K, 3)
    angle: np.ndarray  # (K,) radians
    frequency: np.ndarray  # (K,) cycles across the image
    blob_home: np.ndarray  # (K, 2) centre in [-1, 1]^2


@lru_cache(maxsize=32)
def class_styles(classes: int, seed: int) -> ClassStyles:
    """The styles of `classes` classes for `seed` (cached: every sample needs them)."""
    rng = rng_for(seed, _STYLE_TAG, classes)
    angle = (np.arange(classes) * np.pi / classes + rng.uniform(0, np.pi / classes)) % np.pi
    return ClassStyles(
        foreground=rng.uniform(0.15, 0.85, (classes, 3)),
        background=rng.uniform(0.15, 0.85, (classes, 3)),
        blob_colour=rng.uniform(0.0, 1.0, (classes, 3)),
        angle=rng.permutation(angle),
        frequency=rng.choice([1.5, 2.5, 3.5], classes),
        blob_home=rng.uniform(-0.5, 0.5, (classes, 2)),
    )


def sample_labels(indices: np.ndarray, classes: int) -> np.ndarray:
    """The labels of samples `indices` (int64), without drawing them."""
    return np.asarray(indices, dtype=np.int64) % classes


def _grid(image_size: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """Pixel-centre coordinates in [-1, 1]: (y column, x row) for broadcasting."""
    h, w = image_size
    ys = (np.arange(h, dtype=np.float32) + 0.5) / h * 2 - 1
    xs = (np.arange(w, dtype=np.float32) + 0.5) / w * 2 - 1
    return ys[:, None], xs[None, :]


def _column(rgb: np.ndarray) -> np.ndarray:
    """An RGB triple shaped (3, 1, 1) to broadcast over a channels-first image."""
    return np.asarray(rgb, dtype=np.float32).reshape(3, 1, 1)


def draw_sample(recipe: SyntheticRecipe, index: int) -> np.ndarray:
    """Sample `index` of `recipe` as a uint8 H x W x `channels` image."""
    style = class_styles(recipe.classes, recipe.seed)
    c = int(index) % recipe.classes
    rng = rng_for(recipe.seed, _SAMPLE_TAG, index)
    ys, xs = _grid(recipe.image_size)

    angle = style.angle[c] + rng.normal(0, 0.1)
    freq = style.frequency[c] * rng.uniform(0.85, 1.15)
    along = xs * np.float32(np.cos(angle)) + ys * np.float32(np.sin(angle))
    wave = np.sin(np.float32(np.pi * freq) * along + np.float32(rng.uniform(0, 2 * np.pi)))
    mix = 0.5 + np.float32(0.5 * rng.uniform(0.3, 0.9)) * wave
    fg = _column(style.foreground[c] + rng.normal(0, 0.14, 3))
    bg = _column(style.background[c] + rng.normal(0, 0.14, 3))
    image = bg + (fg - bg) * mix  # channels first: 3 x H x W

    cy, cx = style.blob_home[c] + rng.normal(0, 0.25, 2)
    radius = rng.uniform(0.15, 0.35)
    blob = np.exp(((ys - np.float32(cy)) ** 2 + (xs - np.float32(cx)) ** 2) * np.float32(-0.5 / radius**2)) * 0.8
    blob_colour = _column(style.blob_colour[c] + rng.normal(0, 0.15, 3))
    image = image * (1 - blob) + blob_colour * blob

    noise = rng.standard_normal(image.shape, dtype=np.float32) * np.float32(0.06)
    image = image * np.float32(rng.uniform(0.8, 1.2)) + noise
    return _to_uint8(image, recipe.channels)


def _to_uint8(image: np.ndarray, channels: int) -> np.ndarray:
    """A 3 x H x W float image in [0, 1] (clipped) as uint8 H x W x `channels`."""
    if channels == 1:
        image = np.tensordot(_LUMA, image, axes=1)[None]
    scaled = np.clip(image, 0.0, 1.0) * 255 + 0.5
    return scaled.astype(np.uint8).transpose(1, 2, 0)


def draw_samples(recipe: SyntheticRecipe, indices: np.ndarray) -> np.ndarray:
    """Samples `indices` as a uint8 N x H x W x C array (each one as `draw_sample` makes it)."""
    h, w = recipe.image_size
    out = np.empty((len(indices), h, w, recipe.channels), dtype=np.uint8)
    for row, index in enumerate(indices):
        out[row] = draw_sample(recipe, int(index))
    return out
