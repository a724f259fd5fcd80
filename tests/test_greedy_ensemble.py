"""Greedy ensemble selection and its scores on hand-made probabilities with known answers."""

import math

import numpy as np
import pytest

from fleet.report.greedy_ensemble import (
    accuracy,
    expected_calibration_error,
    greedy_selection,
    nll,
    scores,
    uncertainty,
)

RIGHT, WRONG = [0.9, 0.05, 0.05], [0.1, 0.9, 0.0]


def complementary() -> tuple[np.ndarray, np.ndarray]:
    """Models a and b, each right (0.9 on the true class 0) on one half of 4 samples and wrong
    (0.9 on class 1) on the other; c is uniform."""
    a = np.array([RIGHT, RIGHT, WRONG, WRONG])
    b = np.array([WRONG, WRONG, RIGHT, RIGHT])
    c = np.full((4, 3), 1 / 3)
    return np.stack([a, b, c]), np.zeros(4, dtype=np.int64)


def test_nll_and_accuracy_by_hand():
    probs, labels = np.array([[0.5, 0.5], [0.9, 0.1]]), np.array([0, 1])
    assert nll(probs, labels) == pytest.approx(-(math.log(0.5) + math.log(0.1)) / 2)
    assert accuracy(probs, labels) == 0.5  # a tie goes to the lowest class: right on the first
    assert nll(np.array([[1.0, 0.0]]), np.array([1])) == pytest.approx(-math.log(1e-12))  # finite


def test_ece_with_15_equal_width_bins_by_hand():
    probs = np.array([[0.9, 0.1], [0.9, 0.1], [0.6, 0.4]])  # 0.6 is the top of bin (8/15, 9/15]
    labels = np.array([0, 1, 0])  # the 0.9 bin: half right (gap 0.4); the 0.6 bin: all right (gap 0.4)
    assert expected_calibration_error(probs, labels) == pytest.approx(0.4)
    assert expected_calibration_error(np.array([[1.0, 0.0], [0.0, 1.0]]), np.array([0, 1])) == 0.0
    # 0.58 and 0.62 fall in different bins: each bin's gap counts alone (no cancelling out)
    assert expected_calibration_error(np.array([[0.58, 0.42], [0.62, 0.38]]), np.array([1, 0])) == pytest.approx(
        (0.58 + 0.38) / 2)


def test_two_complementary_models_are_chosen_together_and_the_ensemble_is_right_everywhere():
    stack, labels = complementary()
    chosen = greedy_selection(stack, labels, size=4, start=0)
    assert chosen.added[:2] == (0, 1)
    assert chosen.curve[0] == pytest.approx(-(math.log(0.9) + math.log(0.1)) / 2)
    assert chosen.curve[1] == pytest.approx(math.log(2))
    assert chosen.curve[2] > chosen.curve[1] and chosen.curve[3] == pytest.approx(math.log(2))
    assert chosen.kept == 2 and chosen.weights.tolist() == [0.5, 0.5, 0.0]  # the earliest best prefix
    ensemble = scores(stack, chosen.weights, labels)
    single = scores(stack[:1], np.ones(1), labels)
    assert ensemble["accuracy"] == 1.0 and single["accuracy"] == 0.5
    assert ensemble["nll"] == pytest.approx(math.log(2)) and ensemble["nll"] < single["nll"]
    assert ensemble["disagreement"] == pytest.approx(0.5) and single["disagreement"] == 0.0
    assert ensemble["mutual_information"] > 0 and single["mutual_information"] == 0.0


def test_selection_with_replacement_weights_a_model_by_its_count():
    """b alone is better than a; from a, selection adds b twice: (a + 2b) / 3 beats a + b."""
    labels = np.zeros(2, dtype=np.int64)
    a = np.array([[0.2, 0.8], [0.2, 0.8]])
    b = np.array([[0.7, 0.3], [0.7, 0.3]])
    chosen = greedy_selection(np.stack([a, b]), labels, size=3, start=0)
    assert chosen.added == (0, 1, 1) and chosen.kept == 3
    assert chosen.weights == pytest.approx([1 / 3, 2 / 3])
    assert chosen.curve[2] == pytest.approx(-math.log((0.2 + 0.7 + 0.7) / 3))


def test_a_start_no_model_improves_is_kept_alone():
    stack, labels = complementary()
    chosen = greedy_selection(stack[[2, 2]], labels, size=3, start=0)  # two copies of the uniform model
    assert chosen.kept == 1 and chosen.counts.tolist() == [1.0, 0.0]


def test_identical_members_add_no_uncertainty_beyond_their_entropy():
    one = np.array([[0.7, 0.2, 0.1], [0.4, 0.4, 0.2]])
    spread = uncertainty(np.stack([one, one]))
    np.testing.assert_allclose(spread.mutual_information, 0.0, atol=1e-12)
    np.testing.assert_allclose(spread.disagreement, 0.0)
    np.testing.assert_allclose(spread.entropy, -np.sum(one * np.log(one), axis=1))


@pytest.mark.parametrize("size, start", [(0, 0), (2, 3), (2, -1)])
def test_bad_size_or_start_is_a_value_error(size, start):
    stack, labels = complementary()
    with pytest.raises(ValueError, match="expected size >= 1"):
        greedy_selection(stack, labels, size=size, start=start)


def test_labels_that_do_not_fit_are_a_value_error():
    stack, _ = complementary()
    with pytest.raises(ValueError, match="labels outside"):
        greedy_selection(stack, np.full(4, 3), size=2)
