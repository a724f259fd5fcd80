"""`TreeStateCodec`: engine states as `fleet.safetree` archives (JSON and ``.npy`` arrays).

The codec of the emulated engine as it is, and of a framework's engine given how its tensors
become numpy arrays and back. Decoding never runs code from the bytes (see `fleet.safetree`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from fleet import safetree
from fleet.engines._base import StateCodec


class TreeStateCodec(StateCodec):
    """States (dicts of plain values and arrays) <-> `fleet.safetree` bytes.

    Args:
        to_array: turns a framework tensor into a host numpy array (None for other leaves).
        from_array: turns each stored array back into what the engine's state holds.
    """

    def __init__(
        self,
        to_array: Callable[[Any], np.ndarray | None] | None = None,
        from_array: Callable[[np.ndarray], Any] | None = None,
    ):
        self._to_array, self._from_array = to_array, from_array

    def encode(self, state: Mapping[str, Any]) -> bytes:
        return safetree.dumps(dict(state), self._to_array)

    def decode(self, data: bytes) -> dict[str, Any]:
        state = safetree.loads(data, self._from_array)
        if not isinstance(state, dict):
            raise ValueError(f"not an engine state (a {type(state).__name__})")
        return state
