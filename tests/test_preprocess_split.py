"""Train/validation(/test) splits and epoch orders: stratified, complete, deterministic."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from preprocess.split import epoch_order, split_indices, split_three


def test_split_is_stratified_and_deterministic():
    labels = np.repeat(np.arange(4), [100, 50, 30, 20])
    train, val = split_indices(labels, 0.2, seed=5)
    assert np.bincount(labels[val], minlength=4).tolist() == [20, 10, 6, 4]
    again = split_indices(labels, 0.2, seed=5)
    np.testing.assert_array_equal(train, again[0])
    np.testing.assert_array_equal(val, again[1])
    other = split_indices(labels, 0.2, seed=6)[1]
    assert not np.array_equal(val, other)
    assert train.dtype == val.dtype == np.int64


def test_every_class_keeps_a_training_sample():
    labels = np.array([0, 1, 1, 2, 2, 2])
    train, val = split_indices(labels, 0.9, seed=0)
    assert set(labels[train]) == {0, 1, 2}
    assert len(val) == 3  # all but one of each class


def test_a_test_split_is_held_out_of_training_and_leaves_validation_as_it_was():
    labels = np.repeat(np.arange(4), [100, 50, 30, 20])
    train, val, test = split_three(labels, 0.2, 0.1, seed=5)
    np.testing.assert_array_equal(val, split_indices(labels, 0.2, seed=5)[1])
    assert np.bincount(labels[test], minlength=4).tolist() == [10, 5, 3, 2]
    assert not set(test) & set(val) and not set(test) & set(train)
    assert sorted([*train, *val, *test]) == list(range(len(labels)))
    np.testing.assert_array_equal(test, split_three(labels, 0.2, 0.1, seed=5)[2])
    no_test = split_three(labels, 0.2, 0.0, seed=5)
    assert len(no_test[2]) == 0 and no_test[2].dtype == np.int64
    np.testing.assert_array_equal(no_test[0], split_indices(labels, 0.2, seed=5)[0])


def test_a_test_split_still_leaves_each_class_a_training_sample():
    labels = np.array([0, 0, 1, 1, 1, 2, 2, 2, 2])
    train, val, test = split_three(labels, 0.5, 0.45, seed=1)
    assert set(labels[train]) == {0, 1, 2} and len(test) >= 1


def test_small_sets_still_get_a_validation_sample():
    labels = np.array([0, 0, 1, 1, 1])
    assert len(split_indices(labels, 0.05, seed=0)[1]) == 1


@settings(max_examples=60, deadline=None)
@given(
    counts=st.lists(st.integers(1, 40), min_size=2, max_size=8),
    fraction=st.floats(0.01, 0.99),
    seed=st.integers(-(2**63), 2**63 - 1),
)
def test_split_partitions_all_indices(counts, fraction, seed):
    labels = np.random.default_rng(0).permutation(np.repeat(np.arange(len(counts)), counts))
    train, val = split_indices(labels, fraction, seed)
    assert sorted(np.concatenate([train, val]).tolist()) == list(range(len(labels)))
    assert set(labels[train]) == set(labels)
    per_class = np.bincount(labels[val], minlength=len(counts))
    assert (np.abs(per_class - np.array(counts) * fraction) < 1.0).all()


def test_epoch_order_is_a_seeded_shuffle():
    train = np.arange(10, 110)
    first = epoch_order(train, seed=1, epoch=0)
    assert sorted(first.tolist()) == train.tolist()
    np.testing.assert_array_equal(first, epoch_order(train, seed=1, epoch=0))
    assert not np.array_equal(first, epoch_order(train, seed=1, epoch=1))
    assert not np.array_equal(first, epoch_order(train, seed=2, epoch=0))
    assert not np.array_equal(first, train)
