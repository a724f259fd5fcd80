"""`source: synthetic`: deterministic images drawn on demand (drawing is this source's decoding)."""

from __future__ import annotations

import numpy as np

from fleet.errors import UserError
from preprocess.generator import SyntheticRecipe, draw_samples, sample_labels
from preprocess.readers._base import RawBatch, Reader, ReaderEntry, as_indices


class SyntheticReader(Reader):
    """`samples` images of `recipe`; sample i depends on (recipe.seed, i) only.

    Nothing is stored: `labels` is computed from the indices and `read` draws the images.
    """

    source = "synthetic"

    def __init__(self, recipe: SyntheticRecipe, samples: int):
        if recipe.classes < 2:
            raise UserError(f"data.classes: {recipe.classes} classes; a classifier needs at least 2")
        if samples < recipe.classes:
            raise UserError(f"data.samples: {samples} samples cannot cover {recipe.classes} classes")
        self.recipe = recipe
        self._labels = sample_labels(np.arange(samples), recipe.classes)

    @property
    def num_classes(self) -> int:
        return self.recipe.classes

    @property
    def labels(self) -> np.ndarray:
        return self._labels

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return (*self.recipe.image_size, self.recipe.channels)

    def read(self, indices: np.ndarray) -> RawBatch:
        idx = as_indices(indices, len(self._labels))
        return RawBatch(
            items=draw_samples(self.recipe, idx),
            labels=self._labels[idx],
            names=[f"synthetic[{i}]" for i in idx],
        )


def open_synthetic(data, seed: int) -> Reader:
    """The registry's opener: the images the spec's ``data`` and `seed` draw."""
    return SyntheticReader(SyntheticRecipe(data.classes, data.image_size, data.channels, seed), data.samples)


ENTRY = ReaderEntry(open_synthetic)
