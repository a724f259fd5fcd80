"""Groups of a data set, for learning over groups (one model per group and configuration).

A grouped HDF5 data set holds, beside ``images`` and ``labels``, a 1-D dataset of each
sample's group key (text, or integers) — ``groups`` as ``fleet data make synthetic --groups``
writes it, or any name (``data.group_by: {dataset: NAME}``). This module holds what does not
depend on the file: Zipf-skewed group sizes for synthetic data, the keys' sizes, and group keys
made into model-id parts.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence

import numpy as np

GROUPS_DATASET = "groups"
_NOT_IN_ID = re.compile(r"[^a-z0-9]+")


def zipf_sizes(total: int, groups: int, exponent: float, minimum: int = 1) -> list[int]:
    """`total` samples over `groups` groups, group ``k`` (from 0) about ``1 / (k + 1) ** exponent``
    of the others, each at least `minimum`; they sum to `total`, largest first.

    Raises:
        ValueError: fewer than one group, a negative exponent, or too few samples for the minimum.
    """
    if groups < 1:
        raise ValueError(f"expected at least 1 group, got {groups}")
    if exponent < 0:
        raise ValueError(f"expected a skew (Zipf exponent) >= 0, got {exponent}")
    if total < groups * minimum:
        raise ValueError(f"{total} samples cannot give {groups} groups {minimum} sample(s) each")
    weights = 1.0 / np.arange(1, groups + 1) ** exponent
    spare = total - groups * minimum
    shares = spare * weights / weights.sum()
    sizes = np.floor(shares).astype(int)
    for k in np.argsort(-(shares - sizes), kind="stable")[: spare - int(sizes.sum())]:
        sizes[k] += 1  # the largest remainders take what flooring left
    return [int(s) + minimum for s in sizes]


def group_key_names(groups: int) -> list[str]:
    """Synthetic group keys: ``g000``, ``g001``, ... (sorted order is index order)."""
    width = max(3, len(str(groups - 1)))
    return [f"g{k:0{width}d}" for k in range(groups)]


def group_sizes(keys: Sequence[str]) -> list[tuple[str, int]]:
    """Each group key with its sample count, largest first (ties by key)."""
    return sorted(Counter(keys).items(), key=lambda item: (-item[1], item[0]))


def id_part(key: str) -> str:
    """A group key as it goes into a model id: lower case, runs of anything else than letters
    and digits as one ``-``, trimmed (``"São Paulo"`` -> ``s-o-paulo``); ``group`` if nothing is left."""
    return _NOT_IN_ID.sub("-", key.lower()).strip("-") or "group"
