"""Seeded random generators keyed by integers: the same keys give the same stream on every process."""

from __future__ import annotations

import numpy as np

_UINT64 = (1 << 64) - 1


def rng_for(*keys: int) -> np.random.Generator:
    """A generator determined by `keys` only (negative keys are fine: they wrap to uint64).

    Args:
        *keys: integers such as (seed, purpose tag, sample index).

    Returns:
        A fresh `np.random.Generator` (PCG64) seeded from the keys.
    """
    return np.random.default_rng(np.random.SeedSequence([int(k) & _UINT64 for k in keys]))
