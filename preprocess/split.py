"""Train/validation splits and per-epoch orders: pure, seeded, identical on every process."""

from __future__ import annotations

import numpy as np

from preprocess.seeding import rng_for

_SPLIT_TAG = 0x5B117
_EPOCH_TAG = 0xE90C


def _val_counts(class_sizes: np.ndarray, val_fraction: float) -> np.ndarray:
    """Validation samples per class: the floor or the ceiling of ``size * val_fraction``
    (largest remainders round up, to hit the overall fraction), at most ``size - 1``, and at
    least one sample overall when some class has two."""
    room = np.maximum(class_sizes - 1, 0)
    exact = class_sizes * val_fraction
    counts = np.minimum(np.floor(exact), room).astype(np.int64)
    upper = np.minimum(np.ceil(exact), room).astype(np.int64)
    target = min(max(int(round(exact.sum())), min(1, int(room.sum()))), int(upper.sum()))
    by_remainder = np.argsort(-(exact - np.floor(exact)), kind="stable")
    can_grow = [c for c in by_remainder if counts[c] < upper[c]]
    counts[can_grow[: target - counts.sum()]] += 1
    return counts


def train_count(class_sizes, val_fraction: float) -> int:
    """Training samples `split_indices` leaves of a data set with `class_sizes` samples per
    class (known from a partition manifest without reading the data)."""
    sizes = np.asarray([s for s in class_sizes if s > 0], dtype=np.int64)
    return int(sizes.sum() - _val_counts(sizes, val_fraction).sum())


def split_indices(labels: np.ndarray, val_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Split sample indices into training and validation sets, stratified by label.

    Every class keeps at least one training sample; each class gives about `val_fraction` of
    its samples to validation. The same (labels, val_fraction, seed) give the same split.

    Args:
        labels: int labels, one per sample.
        val_fraction: the share of samples for validation, in (0, 1).
        seed: the split's seed.

    Returns:
        (train_idx, val_idx): sorted int64 arrays that partition ``range(len(labels))``.
    """
    labels = np.asarray(labels, dtype=np.int64)
    classes, inverse = np.unique(labels, return_inverse=True)
    counts = _val_counts(np.bincount(inverse, minlength=len(classes)), val_fraction)
    rng = rng_for(seed, _SPLIT_TAG)
    val = [rng.permutation(np.flatnonzero(inverse == c))[:n] for c, n in enumerate(counts)]
    val_idx = np.sort(np.concatenate(val)) if val else np.empty(0, np.int64)
    is_val = np.zeros(len(labels), dtype=bool)
    is_val[val_idx] = True
    return np.flatnonzero(~is_val).astype(np.int64), val_idx.astype(np.int64)


def split_blocks(labels: np.ndarray, sizes, val_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """`split_indices` of each block of consecutive samples (`sizes`: their lengths) on its own,
    as indices into the whole: the partitions of partitioned data read as one data set split
    exactly as each node splits its own partition."""
    train, val, start = [], [], 0
    for size in sizes:
        block_train, block_val = split_indices(labels[start:start + size], val_fraction, seed)
        train.append(block_train + start)
        val.append(block_val + start)
        start += size
    if start != len(labels):
        raise ValueError(f"blocks of {sum(sizes)} samples for {len(labels)} labels")
    return np.concatenate(train), np.concatenate(val)


def epoch_order(train_idx: np.ndarray, seed: int, epoch: int) -> np.ndarray:
    """`train_idx` shuffled for `epoch`: the same (seed, epoch) give the same order everywhere."""
    train_idx = np.asarray(train_idx, dtype=np.int64)
    return train_idx[rng_for(seed, _EPOCH_TAG, epoch).permutation(len(train_idx))]
