"""A batch's rows in pieces: what the runtime's batcher hands the engines (torch-free).

A batch that spans the shares it arrived in is passed on as those shares' rows, not copied
into one array; the engine joins them where it uses them (see `fleet.engines._base`).
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Sequence
from typing import Any, Union

import numpy as np


@dataclass(frozen=True)
class Pieces:
    """A batch's rows as consecutive pieces (at least one), joined only where they are used."""

    parts: tuple[np.ndarray, ...]

    def __post_init__(self) -> None:
        if not self.parts:
            raise ValueError("Pieces needs at least one piece")

    def __len__(self) -> int:
        return sum(len(part) for part in self.parts)

    @property
    def shape(self) -> tuple[int, ...]:
        return (len(self), *self.parts[0].shape[1:])

    @property
    def ndim(self) -> int:
        return self.parts[0].ndim

    def join(self, out: np.ndarray | None = None) -> np.ndarray:
        """One array of the rows (a single piece as it is, unless `out` is given)."""
        if out is None:
            return join(self.parts)
        return np.concatenate(self.parts, out=out, casting="same_kind")

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        if copy is False and len(self.parts) > 1:
            raise ValueError("joining the pieces of a batch needs a copy")
        joined = self.join()
        if copy:
            return np.array(joined, dtype=dtype, copy=True)
        return joined if dtype is None else joined.astype(dtype, copy=False)


Rows = Union[np.ndarray, Pieces]


def join(parts: Sequence[np.ndarray]) -> np.ndarray:
    """One array from consecutive pieces; a single piece is passed on as it is (no copy)."""
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def joined(x: Rows) -> np.ndarray:
    """`x`'s rows as one array (no copy for an array or a single piece)."""
    return x.join() if isinstance(x, Pieces) else x
