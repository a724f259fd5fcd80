"""Groups of a data set, for learning over groups (one model per group and configuration).

A grouped HDF5 data set holds, beside ``images`` and ``labels``, a 1-D dataset of each
sample's group key (text, or integers) — ``groups`` as ``fleet data make synthetic --groups``
writes it, or any name (``data.group_by: {dataset: NAME}``). This module holds what does not
depend on the file: Zipf-skewed group sizes for synthetic data (`zipf_sizes`, the planner's
`fleet.schedule.grouping.zipf_sizes`, which the simulator's grouped workloads share), the keys' sizes, and group keys
made into model-id parts.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence

from fleet.schedule.grouping import zipf_sizes

GROUPS_DATASET = "groups"
__all__ = ["GROUPS_DATASET", "zipf_sizes", "group_key_names", "group_sizes", "id_part"]
_NOT_IN_ID = re.compile(r"[^a-z0-9]+")


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
