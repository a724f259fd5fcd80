"""Caruana's greedy ensemble selection and what an ensemble's predictions score (pure, numpy only).

Every function takes class probabilities: one model's as an ``(N, C)`` array, several models'
as a ``(M, N, C)`` array (or a sequence of ``(N, C)`` arrays), and ``labels`` as ``N`` class
indices. Sums run in float64 whatever the inputs' type.

Selection (Caruana et al., "Ensemble selection from libraries of models", ICML 2004): start
from one model (the caller's best single model), then, `size` - 1 times, add the model (any of
the candidates, again if it is already in: *with replacement*) whose addition gives the lowest
negative log-likelihood of the ensemble's mean prediction; ties go to the first candidate. The
ensemble kept is the prefix of those steps with the lowest NLL (the earliest where several tie),
so it never scores worse than its start on the data it was selected on; each member's weight
is its count over the kept prefix's size.

Scores: accuracy, NLL, expected calibration error (equal-width confidence bins), and two
measures of uncertainty: the mean predictive entropy of the ensemble's mean prediction (total
uncertainty), the mean mutual information between the prediction and the member (that entropy
less the members' weighted mean entropy: their disagreement about the probabilities, the
epistemic part; 0 for one model) and the mean disagreement of top classes (the weighted share of
members whose top class differs from the ensemble's).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

ECE_BINS = 15
_FLOOR = 1e-12  # probabilities below this count as this in logarithms (a confident miss costs ~27.6 nats)


def as_stack(probabilities: np.ndarray | Sequence[np.ndarray]) -> np.ndarray:
    """Several models' probabilities as one float64 ``(M, N, C)`` array (ValueError on ragged shapes)."""
    stack = np.asarray(probabilities, dtype=np.float64)
    if stack.ndim != 3 or 0 in stack.shape:
        raise ValueError(f"expected the probabilities of M models, (M, N, C) with none 0, got shape {stack.shape}")
    return stack


def _checked(probs: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    probs = np.asarray(probs, dtype=np.float64)
    labels = np.asarray(labels, dtype=np.int64)
    if probs.ndim != 2 or labels.shape != (len(probs),) or not len(probs):
        raise ValueError(f"expected (N, C) probabilities and N labels, got {probs.shape} and {labels.shape}")
    if labels.min() < 0 or labels.max() >= probs.shape[1]:
        raise ValueError(f"labels outside [0, {probs.shape[1]})")
    return probs, labels


def nll(probs: np.ndarray, labels: np.ndarray) -> float:
    """Mean negative log-likelihood (nats) of the true classes."""
    probs, labels = _checked(probs, labels)
    return float(-np.mean(np.log(np.maximum(probs[np.arange(len(labels)), labels], _FLOOR))))


def accuracy(probs: np.ndarray, labels: np.ndarray) -> float:
    """Share of samples whose most probable class is the true one (ties: the lowest class)."""
    probs, labels = _checked(probs, labels)
    return float(np.mean(probs.argmax(axis=1) == labels))


def expected_calibration_error(probs: np.ndarray, labels: np.ndarray, bins: int = ECE_BINS) -> float:
    """ECE: over `bins` equal-width bins of the top class's probability (bin k holds
    confidences in (k/bins, (k+1)/bins], the first one 0 too), the sample-weighted mean of
    |accuracy - mean confidence| of each bin."""
    probs, labels = _checked(probs, labels)
    confidence = probs.max(axis=1)
    correct = (probs.argmax(axis=1) == labels).astype(np.float64)
    which = np.clip(np.ceil(confidence * bins).astype(np.int64) - 1, 0, bins - 1)
    counts = np.bincount(which, minlength=bins)
    gaps = np.abs(np.bincount(which, correct, bins) - np.bincount(which, confidence, bins))
    return float(gaps.sum() / counts.sum())


def entropy(probs: np.ndarray) -> np.ndarray:
    """Each sample's entropy (nats) of an ``(..., N, C)`` array of probabilities."""
    probs = np.asarray(probs, dtype=np.float64)
    return -np.sum(probs * np.log(np.maximum(probs, _FLOOR)), axis=-1)


def mixture(stack: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """The weighted mean prediction ``(N, C)`` of a ``(M, N, C)`` stack (`weights`: M, summing to 1)."""
    return np.tensordot(np.asarray(weights, dtype=np.float64), stack, axes=1)


@dataclass(frozen=True)
class Uncertainty:
    """Per-sample uncertainty of a weighted ensemble (arrays of N).

    Attributes:
        entropy: the entropy of the mean prediction (total uncertainty).
        mutual_information: that entropy less the members' weighted mean entropy (>= 0; 0 for one model).
        disagreement: the weighted share of members whose top class is not the ensemble's.
    """

    entropy: np.ndarray
    mutual_information: np.ndarray
    disagreement: np.ndarray


def uncertainty(stack: np.ndarray | Sequence[np.ndarray], weights: np.ndarray | None = None) -> Uncertainty:
    """`Uncertainty` of the members' probabilities `stack` (M, N, C) at `weights` (default equal)."""
    stack = as_stack(stack)
    weights = np.full(len(stack), 1.0 / len(stack)) if weights is None else np.asarray(weights, dtype=np.float64)
    mean = mixture(stack, weights)
    total = entropy(mean)
    mutual = np.maximum(total - weights @ entropy(stack), 0.0)
    differs = (stack.argmax(axis=2) != mean.argmax(axis=1)).astype(np.float64)
    return Uncertainty(total, mutual, weights @ differs)


def scores(stack: np.ndarray | Sequence[np.ndarray], weights: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """Accuracy, NLL, ECE and the mean uncertainty of a weighted ensemble on `labels`."""
    stack = as_stack(stack)
    mean = mixture(stack, weights)
    spread = uncertainty(stack, weights)
    return {
        "accuracy": accuracy(mean, labels), "nll": nll(mean, labels),
        "ece": expected_calibration_error(mean, labels), "entropy": float(spread.entropy.mean()),
        "mutual_information": float(spread.mutual_information.mean()),
        "disagreement": float(spread.disagreement.mean()), "samples": int(len(labels)),
    }


@dataclass(frozen=True)
class Selection:
    """What greedy selection chose.

    Attributes:
        counts: how often each candidate is in the kept ensemble (M integers).
        added: the candidate added at each step, the start first (`size` of them).
        curve: the NLL of the ensemble after each step (`size` values).
        kept: how many steps the kept ensemble has (the prefix of lowest NLL).
    """

    counts: np.ndarray
    added: tuple[int, ...]
    curve: tuple[float, ...]
    kept: int

    @property
    def weights(self) -> np.ndarray:
        """Each candidate's weight: its count over the kept size."""
        return self.counts / self.kept


def greedy_selection(stack: np.ndarray | Sequence[np.ndarray], labels: np.ndarray, size: int, start: int = 0) -> Selection:
    """Caruana's greedy selection with replacement on (validation) probabilities `stack`
    (M, N, C), from candidate `start`, `size` steps in all (see the module docstring).

    Raises:
        ValueError: `size` below 1, `start` not a candidate, or shapes that do not fit.
    """
    stack = as_stack(stack)
    _checked(stack[0], labels)
    if size < 1 or not 0 <= start < len(stack):
        raise ValueError(f"expected size >= 1 and 0 <= start < {len(stack)}, got {size} and {start}")
    picked_p = stack[:, np.arange(len(labels)), np.asarray(labels, dtype=np.int64)]  # (M, N): each true class's
    total = picked_p[start].copy()
    added, curve = [start], [_mean_nll(total)]
    for step in range(2, size + 1):
        trials = [_mean_nll((total + picked_p[m]) / step) for m in range(len(stack))]
        best = int(np.argmin(trials))
        total += picked_p[best]
        added.append(best)
        curve.append(trials[best])
    kept = int(np.argmin(curve)) + 1
    counts = np.bincount(np.asarray(added[:kept]), minlength=len(stack)).astype(np.float64)
    return Selection(counts, tuple(added), tuple(curve), kept)


def _mean_nll(true_p: np.ndarray) -> float:
    """NLL from the ensemble's probability of each true class (the mean over its members)."""
    return float(-np.mean(np.log(np.maximum(true_p, _FLOOR))))
