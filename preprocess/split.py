"""Train/validation(/test) splits and per-epoch orders: pure, seeded, identical on every process."""

from __future__ import annotations

import numpy as np

from preprocess.seeding import rng_for

_SPLIT_TAG = 0x5B117
_EPOCH_TAG = 0xE90C


def _val_counts(class_sizes: np.ndarray, val_fraction: float, taken: np.ndarray | None = None) -> np.ndarray:
    """Held-out samples per class: the floor or the ceiling of ``size * val_fraction``
    (largest remainders round up, to hit the overall fraction), at most ``size - 1`` less the
    samples already `taken` from the class (the validation samples, when counting the test
    split's), and at least one sample overall when some class has room for one."""
    room = np.maximum(class_sizes - 1 - (0 if taken is None else taken), 0)
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
    train_idx, val_idx, _ = split_three(labels, val_fraction, 0.0, seed)
    return train_idx, val_idx


def split_three(labels: np.ndarray, val_fraction: float, test_fraction: float,
                seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`split_indices` with a held-out test set as well, stratified by label.

    Each class's samples are shuffled once: its first ones go to validation (exactly those
    `split_indices` picks with the same arguments, so a test fraction of 0 changes nothing),
    the next ones, about `test_fraction` of the class, to the test set; every class keeps at
    least one training sample.

    Args:
        labels: int labels, one per sample.
        val_fraction: the share of samples for validation, in (0, 1).
        test_fraction: the share of samples for the test set, in [0, 1 - val_fraction).
        seed: the split's seed.

    Returns:
        (train_idx, val_idx, test_idx): sorted int64 arrays that partition ``range(len(labels))``.
    """
    labels = np.asarray(labels, dtype=np.int64)
    classes, inverse = np.unique(labels, return_inverse=True)
    sizes = np.bincount(inverse, minlength=len(classes))
    val_counts = _val_counts(sizes, val_fraction)
    test_counts = _val_counts(sizes, test_fraction, val_counts) if test_fraction > 0 else np.zeros_like(sizes)
    rng = rng_for(seed, _SPLIT_TAG)
    shuffled = [rng.permutation(np.flatnonzero(inverse == c)) for c in range(len(classes))]
    val = [order[:n] for order, n in zip(shuffled, val_counts)]
    test = [order[n:n + t] for order, n, t in zip(shuffled, val_counts, test_counts)]
    val_idx, test_idx = _joined(val), _joined(test)
    held_out = np.zeros(len(labels), dtype=bool)
    held_out[val_idx] = True
    held_out[test_idx] = True
    return np.flatnonzero(~held_out).astype(np.int64), val_idx, test_idx


def _joined(parts: list[np.ndarray]) -> np.ndarray:
    return np.sort(np.concatenate(parts)).astype(np.int64) if parts else np.empty(0, np.int64)


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
