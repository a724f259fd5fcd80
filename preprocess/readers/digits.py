"""`source: digits`: scikit-learn's bundled 8x8 handwritten digits (1797 samples, 10 classes)."""

from __future__ import annotations

import numpy as np

from preprocess.readers._base import RawBatch, Reader, ReaderEntry, as_indices, check_declared_classes


def load_digit_images() -> tuple[np.ndarray, np.ndarray]:
    """The digits as uint8 N x 8 x 8 x 1 (values 0..16 scaled to 0..255) and int64 labels."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    images = np.rint(bunch.images * (255.0 / 16.0)).clip(0, 255).astype(np.uint8)
    return images[..., None], bunch.target.astype(np.int64)


class DigitsReader(Reader):
    """The whole set in memory (about 115 KB); `read` copies the requested samples."""

    source = "digits"

    def __init__(self, declared_classes: int | None = None):
        self._images, self._labels = load_digit_images()
        self._classes = check_declared_classes(declared_classes, 10, "digits", "classes (the digits 0..9)")

    @property
    def num_classes(self) -> int:
        return self._classes

    @property
    def labels(self) -> np.ndarray:
        return self._labels

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return (8, 8, 1)

    def read(self, indices: np.ndarray) -> RawBatch:
        idx = as_indices(indices, len(self._labels))
        return RawBatch(items=self._images[idx], labels=self._labels[idx], names=[f"digits[{i}]" for i in idx])


def open_digits(data, seed: int) -> Reader:
    """The registry's opener: the bundled digits, with the spec's ``data.classes``."""
    return DigitsReader(data.classes)


ENTRY = ReaderEntry(open_digits)
