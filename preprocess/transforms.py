"""The preprocessing pipeline: spec ops -> steps that turn a `RawBatch` into float32 NCHW.

Between steps a batch is an N x C x H x W array (uint8 or float32) when every image has the
same size: steps then work on the whole batch at once, channels-first so that numpy's inner
loops run along image rows. Right after decoding files of various sizes it is a list of
H x W x C arrays instead (per-image work; PIL resizes them). Values stay in [0, 255] until
`normalize` (or the final step) scales them.
"""

from __future__ import annotations

import io
from abc import ABC, abstractmethod
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Sequence, Union

import numpy as np
from PIL import Image

from fleet.errors import UserError
from fleet.spec.sections import (
    CenterCropOp,
    DataSpec,
    DecodeOp,
    FlipOp,
    NormalizeOp,
    Op,
    RandomCropOp,
    ResizeOp,
)
from preprocess.readers._base import RawBatch

Images = Union[np.ndarray, list]  # N x C x H x W array, or a list of H x W x C arrays
_LUMA = np.array([0.299, 0.587, 0.114], dtype=np.float32)


@dataclass(frozen=True)
class Batch:
    """Images on their way through the pipeline, with the names used in error messages."""

    images: Images
    names: Sequence[str]
    scaled: bool = False  # True once values are in model space (normalize ran)

    def with_images(self, images: Images, **changes: bool) -> "Batch":
        return replace(self, images=stack_if_uniform(images), **changes)


def channels_first(images: np.ndarray) -> np.ndarray:
    """N x H x W x C -> a C-contiguous N x C x H x W copy."""
    return np.ascontiguousarray(images.transpose(0, 3, 1, 2))


def stack_if_uniform(images: Images) -> Images:
    """A list of same-shaped H x W x C images as one N x C x H x W array; else unchanged."""
    if isinstance(images, np.ndarray) or not images:
        return images
    first = images[0]
    if all(img.shape == first.shape and img.dtype == first.dtype for img in images):
        return channels_first(np.stack(images))
    return images


def _sizes(images: Images) -> list[tuple[int, int]]:
    """(H, W) of every image."""
    if isinstance(images, np.ndarray):
        return [(int(images.shape[2]), int(images.shape[3]))] * len(images)
    return [(int(img.shape[0]), int(img.shape[1])) for img in images]


# ----------------------------------------------------------------------------- channels and decode


def match_channels(images: np.ndarray, channels: int) -> np.ndarray:
    """Convert N x H x W x C to `channels`: grey repeats to RGB; RGB becomes L (ITU-R 601-2)."""
    have = images.shape[-1]
    if have == channels:
        return images
    if channels == 3:
        return np.repeat(images, 3, axis=-1)
    grey = images.astype(np.float32) @ _LUMA
    return np.rint(grey)[..., None].astype(images.dtype) if images.dtype == np.uint8 else grey[..., None]


def decode_image(data: bytes, name: str, channels: int, draft: tuple[int, int] | None) -> np.ndarray:
    """Decode JPEG/PNG bytes to uint8 H x W x `channels`.

    Args:
        data: the file's bytes.
        name: the file, for error messages.
        channels: 3 for RGB, 1 for grey (L).
        draft: (H, W) the next op resizes to; lets a JPEG decode at a reduced scale that
            stays at least that large (`Image.draft`).

    Raises:
        UserError: the bytes are not a decodable image.
    """
    mode = "RGB" if channels == 3 else "L"
    try:
        with Image.open(io.BytesIO(data)) as image:
            if draft is not None and image.format == "JPEG":
                image.draft(mode, (draft[1], draft[0]))
            pixels = np.asarray(image if image.mode == mode else image.convert(mode))
    except Image.UnidentifiedImageError:  # its message names the in-memory file object
        raise UserError(f"{name}: cannot decode image (not a JPEG or PNG file)") from None
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
        raise UserError(f"{name}: cannot decode image ({str(exc) or exc.__class__.__name__})") from None
    return pixels[..., None] if pixels.ndim == 2 else pixels


# ----------------------------------------------------------------------------- resampling


@lru_cache(maxsize=64)
def resample_matrix(size_in: int, size_out: int) -> np.ndarray:
    """Bilinear (triangle-filter, antialiased like PIL's BILINEAR) weights, shape (out, in)."""
    scale = size_in / size_out
    support = max(scale, 1.0)
    centres = (np.arange(size_out) + 0.5) * scale
    offsets = (np.arange(size_in) + 0.5)[None, :] - centres[:, None]
    weights = np.clip(1.0 - np.abs(offsets) / support, 0.0, None)
    return (weights / weights.sum(axis=1, keepdims=True)).astype(np.float32)


def resize_batch(images: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Resize an N x C x H x W batch to `size` (H, W) with two matrix products; float32 out."""
    n, c, h, w = images.shape
    rows = resample_matrix(h, size[0]) @ images.astype(np.float32, copy=False).reshape(n * c, h, w)
    cols = rows.reshape(-1, w) @ resample_matrix(w, size[1]).T
    return cols.reshape(n, c, size[0], size[1])


def resize_image(image: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Resize one H x W x C image to `size` (H, W): PIL for uint8, matrices otherwise."""
    if image.shape[:2] == size:
        return image
    if image.dtype != np.uint8:
        return resize_batch(image.transpose(2, 0, 1)[None], size)[0].transpose(1, 2, 0)
    channels = image.shape[2]
    pil = Image.fromarray(image[..., 0] if channels == 1 else image)
    out = np.asarray(pil.resize((size[1], size[0]), Image.BILINEAR))
    return out.reshape(size[0], size[1], channels)


# ----------------------------------------------------------------------------- crops


def _too_small(name: str, hw: tuple[int, int], op: str, size: tuple[int, int], hint: str = "") -> UserError:
    return UserError(f"{name}: image is {hw[0]}x{hw[1]}, smaller than the {op} size {size[0]}x{size[1]}{hint}")


def crop_at(images: Images, tops: np.ndarray, lefts: np.ndarray, size: tuple[int, int]) -> Images:
    """Crop `size` (H, W) from each image at its own (top, left)."""
    h, w = size
    if isinstance(images, list):
        return [img[t : t + h, l : l + w] for img, t, l in zip(images, tops, lefts)]
    if len(tops) and (tops == tops[0]).all() and (lefts == lefts[0]).all():
        return images[:, :, tops[0] : tops[0] + h, lefts[0] : lefts[0] + w]
    out = np.empty((*images.shape[:2], h, w), dtype=images.dtype)
    for i, (t, l) in enumerate(zip(tops, lefts)):
        out[i] = images[i, :, t : t + h, l : l + w]
    return out


def pad_images(images: Images, pad: tuple[int, int]) -> Images:
    """Zero-pad (top/bottom, left/right) pixels on each side."""
    if pad == (0, 0):
        return images
    rows, cols = (pad[0], pad[0]), (pad[1], pad[1])
    if isinstance(images, list):
        return [np.pad(img, (rows, cols, (0, 0))) for img in images]
    return np.pad(images, ((0, 0), (0, 0), rows, cols))


def center_crop(batch: Batch, size: tuple[int, int], op: str = "center_crop") -> Images:
    """Crop `size` from each image's centre; an image smaller than `size` is a `UserError`."""
    sizes = _sizes(batch.images)
    for name, hw in zip(batch.names, sizes):
        if hw[0] < size[0] or hw[1] < size[1]:
            raise _too_small(name, hw, op, size, " (resize first)")
    tops = np.array([(hw[0] - size[0]) // 2 for hw in sizes], dtype=np.int64)
    lefts = np.array([(hw[1] - size[1]) // 2 for hw in sizes], dtype=np.int64)
    return crop_at(batch.images, tops, lefts, size)


# ----------------------------------------------------------------------------- steps


class Step(ABC):
    """One pipeline op: ``step(batch, rng, train) -> batch``; randomness only from `rng`."""

    @abstractmethod
    def __call__(self, batch: Batch, rng: np.random.Generator, train: bool) -> Batch:
        """Apply the op to every image of `batch`."""


@dataclass(frozen=True)
class Decode(Step):
    """Bytes -> uint8 H x W x C (a no-op for arrays, which arrive decoded)."""

    channels: int
    draft: tuple[int, int] | None = None

    def __call__(self, batch: Batch, rng: np.random.Generator, train: bool) -> Batch:
        if isinstance(batch.images, np.ndarray):
            return batch
        decoded = [decode_image(data, name, self.channels, self.draft) for data, name in zip(batch.images, batch.names)]
        return batch.with_images(decoded)


@dataclass(frozen=True)
class Resize(Step):
    """Bilinear resize to `size` (H, W)."""

    size: tuple[int, int]

    def __call__(self, batch: Batch, rng: np.random.Generator, train: bool) -> Batch:
        images = batch.images
        if isinstance(images, np.ndarray):
            return batch if images.shape[2:] == self.size else batch.with_images(resize_batch(images, self.size))
        return batch.with_images([resize_image(img, self.size) for img in images])


@dataclass(frozen=True)
class CenterCrop(Step):
    """Crop `size` (H, W) from the centre."""

    size: tuple[int, int]

    def __call__(self, batch: Batch, rng: np.random.Generator, train: bool) -> Batch:
        return batch.with_images(center_crop(batch, self.size))


@dataclass(frozen=True)
class RandomCrop(Step):
    """Train: zero-pad by `padding`, crop `size` at a random place per image. Eval: centre crop."""

    size: tuple[int, int]
    padding: int = 0

    def __call__(self, batch: Batch, rng: np.random.Generator, train: bool) -> Batch:
        if not train:
            return batch.with_images(center_crop(self._padded_to_size(batch), self.size, "random_crop"))
        padded = pad_images(batch.images, (self.padding, self.padding))
        sizes = _sizes(padded)
        for name, (h, w) in zip(batch.names, sizes):
            if h < self.size[0] or w < self.size[1]:
                hint = f" with padding {self.padding}" if self.padding else ""
                raise _too_small(name, (h - 2 * self.padding, w - 2 * self.padding), "random_crop", self.size, hint)
        tops = rng.integers(0, np.array([h - self.size[0] + 1 for h, _ in sizes], dtype=np.int64))
        lefts = rng.integers(0, np.array([w - self.size[1] + 1 for _, w in sizes], dtype=np.int64))
        return batch.with_images(crop_at(padded, tops, lefts, self.size))

    def _padded_to_size(self, batch: Batch) -> Batch:
        """Eval: pad (at most `padding`) only where an image is smaller than `size`."""
        sizes = _sizes(batch.images)
        short = max((max(self.size[0] - h, self.size[1] - w, 0) for h, w in sizes), default=0)
        if short == 0 or short > 2 * self.padding:
            return batch
        return batch.with_images(pad_images(batch.images, ((short + 1) // 2, (short + 1) // 2)))


@dataclass(frozen=True)
class Flip(Step):
    """Train: mirror each image left-right with probability `p`. Eval: nothing."""

    p: float = 0.5

    def __call__(self, batch: Batch, rng: np.random.Generator, train: bool) -> Batch:
        if not train:
            return batch
        flips = rng.random(len(batch.names)) < self.p
        images = batch.images
        if isinstance(images, list):
            return batch.with_images([img[:, ::-1] if f else img for img, f in zip(images, flips)])
        out = images.copy()
        out[flips] = images[flips, ..., ::-1]
        return batch.with_images(out)


@dataclass(frozen=True)
class Normalize(Step):
    """Scale [0, 255] to [0, 1], then (x - mean) / std per channel, in one pass; float32 out."""

    mean: tuple[float, ...]
    std: tuple[float, ...]

    def __call__(self, batch: Batch, rng: np.random.Generator, train: bool) -> Batch:
        std = np.asarray(self.std, dtype=np.float32)
        gain = 1.0 / (255.0 * std)
        shift = -np.asarray(self.mean, dtype=np.float32) / std
        images = batch.images
        if isinstance(images, list):  # H x W x C: per-channel values broadcast on the last axis
            return batch.with_images([img * gain + shift for img in images], scaled=True)
        scaled = images.astype(np.float32, copy=False) * gain[:, None, None] + shift[:, None, None]
        return batch.with_images(scaled, scaled=True)


def build_step(op: Op, data: DataSpec, next_op: Op | None) -> Step:
    """The step for one spec op; a `size` of None means `data.image_size`."""
    size = getattr(op, "size", None) or data.image_size
    if isinstance(op, DecodeOp):
        draft = (next_op.size or data.image_size) if isinstance(next_op, ResizeOp) else None
        return Decode(data.channels, draft)
    if isinstance(op, ResizeOp):
        return Resize(size)
    if isinstance(op, CenterCropOp):
        return CenterCrop(size)
    if isinstance(op, RandomCropOp):
        return RandomCrop(size, op.padding)
    if isinstance(op, FlipOp):
        return Flip(op.p)
    if isinstance(op, NormalizeOp):
        return Normalize(tuple(op.mean), tuple(op.std))
    raise TypeError(f"unknown preprocess op {op!r}")


# ----------------------------------------------------------------------------- the pipeline


class Pipeline:
    """The spec's preprocess ops, applied to `RawBatch`es.

    Args:
        ops: the spec's `preprocess` ops, in order.
        data: the spec's data section; gives `image_size`, `channels` and default sizes.

    A pipeline holds no state between calls and may be shared by threads; randomness
    comes only from the `rng` passed to each call.
    """

    def __init__(self, ops: Sequence[Op], data: DataSpec):
        self.data = data.defaults_filled()
        self.ops = tuple(ops)
        nexts = list(self.ops[1:]) + [None]
        self.steps = [build_step(op, self.data, nxt) for op, nxt in zip(self.ops, nexts)]

    @property
    def output_shape(self) -> tuple[int, int, int]:
        """(C, H, W) of every output sample."""
        return (self.data.channels, *self.data.image_size)

    def __call__(
        self, raw: RawBatch, rng: np.random.Generator, train: bool, out: np.ndarray | None = None
    ) -> np.ndarray:
        """Run the ops on `raw`; augmentations (random_crop, flip) apply only when `train`.

        Args:
            raw: samples from a reader.
            rng: the source of all randomness (same state -> same output).
            train: True for training batches, False for evaluation.
            out: optional float32 (N, C, H, W) C-contiguous buffer to write into.

        Returns:
            float32 (N, C, H, W) C-contiguous (`out` when given).

        Raises:
            UserError: an undecodable file, an image too small for a crop, or a final size
                other than `data.image_size`, naming the first offending item.
        """
        if len(raw) == 0:
            return np.empty((0, *self.output_shape), dtype=np.float32) if out is None else out
        batch = self._start(raw)
        for step in self.steps:
            batch = step(batch, rng, train)
        return self._finish(batch, out)

    def _start(self, raw: RawBatch) -> Batch:
        if not raw.encoded:
            return Batch(channels_first(match_channels(np.asarray(raw.items), self.data.channels)), raw.names)
        if not (self.steps and isinstance(self.steps[0], Decode)):
            raise UserError(f"preprocess: {raw.names[0]} is an encoded image; the first op must be decode")
        return Batch(list(raw.items), raw.names)

    def _finish(self, batch: Batch, out: np.ndarray | None) -> np.ndarray:
        expected = tuple(self.data.image_size)
        for name, hw in zip(batch.names, _sizes(batch.images)):
            if hw != expected:
                raise UserError(
                    f"{name}: image is {hw[0]}x{hw[1]} after preprocessing, "
                    f"expected {expected[0]}x{expected[1]} (add a resize op)"
                )
        images = batch.images
        if isinstance(images, list):  # same sizes, mixed dtypes
            images = channels_first(np.stack([img.astype(np.float32) for img in images]))
        if out is None:
            out = np.empty((len(images), *self.output_shape), dtype=np.float32)
        scale = np.float32(1.0 if batch.scaled else 1.0 / 255.0)
        np.multiply(images, scale, out=out, casting="unsafe")
        return out
