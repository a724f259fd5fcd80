"""Both lower bounds on tiny hand-checkable cases."""

import numpy as np
import pytest

from fleet.schedule.bounds import least_gpu_seconds, lower_bounds, malleable_bound, simple_bound
from fleet.schedule.rates import ModelProfile, RateTable

# n = 60 samples per epoch, one epoch each, M = 2:
#   X: r(1) = 6, r(2) = 10  -> t = 10, 6   -> GPU-seconds 10, 12
#   Y: r(1) = 30, r(2) = 48 -> t = 2, 1.25 -> GPU-seconds 2, 2.5
TINY = RateTable((ModelProfile("X", (6.0, 10.0)), ModelProfile("Y", (30.0, 48.0))), 2, 60)


def test_lb1():
    # max((10 + 2) / 2, max(min t_X, min t_Y)) = max(6, max(6, 1.25)) = 6
    assert lower_bounds(TINY, [1, 1], 2).lb1 == pytest.approx(6)


def test_lb2_malleable():
    # At T = 6, X must run on 2 GPUs throughout: 12 + 2 = 14 > 2 * 6, infeasible.
    # For 6 <= T <= 10, A_X(T) = 12 - 0.5 (T - 6) and A_Y(T) = 2:
    # 14 + 3 - 0.5 T <= 2 T  <=>  T >= 6.8.
    bounds = lower_bounds(TINY, [1, 1], 2)
    assert bounds.lb2 == pytest.approx(6.8, rel=1e-8)
    assert bounds.lb2 >= bounds.lb1


def test_envelope_evaluation():
    times = np.array([10.0, 6.0])
    assert least_gpu_seconds(times, 5.9) == float("inf")
    assert least_gpu_seconds(times, 6.0) == pytest.approx(12)
    assert least_gpu_seconds(times, 8.0) == pytest.approx(11)
    assert least_gpu_seconds(times, 50.0) == pytest.approx(10)


def test_lb2_equals_lb1_with_linear_scaling():
    # perfectly linear scaling: the work bound is exact, so LB2 = LB1 = total work / M
    times = np.array([[8.0, 4.0, 8 / 3, 2.0], [4.0, 2.0, 4 / 3, 1.0]])
    assert simple_bound(times) == pytest.approx(3.0)
    assert malleable_bound(times) == pytest.approx(3.0, rel=1e-8)


def test_lb2_with_a_dominated_count():
    # a third GPU makes Z slower: (t, work) = (4, 4), (2.5, 5), (3, 9); the last is ignored
    times = np.array([[4.0, 2.5, 3.0]])
    assert malleable_bound(times) == pytest.approx(2.5, rel=1e-8)  # max t_min; 5 <= 3 * 2.5


def test_no_model_left_has_no_work_to_bound():
    # a resumed job whose models had all ended: nothing to train, on any number of GPUs
    times = np.zeros((0, 8))
    assert simple_bound(times) == 0.0 and malleable_bound(times) == 0.0
