"""`Gradients`: the tensorflow engine's gradients, on the host only when a collective asks."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from fleet.engines._base import check_flat


class Gradients:
    """The gradients of the last ``compute_gradients``, as TF computed them (one tensor per
    parameter), and the flat float32 host buffer fleet's host collectives reduce.

    The buffer is filled from the tensors when it is first asked for (`host`, `load`,
    `scale`): a one-trainer group, which never asks, makes no host copy. While the tensors
    are held, the buffer holds zeros or stale values; `zero` drops the tensors and zeroes the
    buffer where it was written.

    Args:
        sizes: the parameters' element counts, in order.
    """

    def __init__(self, sizes: Sequence[int]):
        self.sizes = [int(s) for s in sizes]
        self.buffer = np.zeros(sum(self.sizes), dtype=np.float32)
        self._tensors: list[Any] | None = None
        self._written = False

    @property
    def tensors(self) -> list[Any] | None:
        """The gradients as TF tensors, or None when the buffer holds them."""
        return self._tensors

    def hold(self, tensors: Sequence[Any]) -> None:
        self._tensors = list(tensors)

    def host(self) -> np.ndarray:
        """The buffer, holding the gradients."""
        if self._tensors is not None:
            start = 0
            for tensor, size in zip(self._tensors, self.sizes):
                self.buffer[start : start + size] = np.asarray(tensor).reshape(-1)
                start += size
            self._tensors, self._written = None, True
        return self.buffer

    def load(self, flat: Any) -> None:
        """Make `flat` the gradients (a no-op for the buffer itself)."""
        check_flat(flat, self.buffer.size, "load_flat_gradients")
        if flat is self.buffer:
            self.host()
            return
        np.copyto(self.buffer, np.asarray(flat, dtype=np.float32))
        self._tensors, self._written = None, True

    def scale(self, factor: float) -> None:
        self.host()
        self.buffer *= np.float32(factor)

    def zero(self) -> None:
        self._tensors = None
        if self._written:
            self.buffer.fill(0.0)
            self._written = False
