"""Re-estimating remaining epochs (fleet.schedule.forecast): curves, ratios, fallbacks."""

import math

import numpy as np
import pytest

from fleet.schedule.forecast import EpochForecast, fit_curve, stop_epoch


def flattening(epochs, floor=0.8, amp=2.0, tau=3.0):
    return [floor + amp * math.exp(-k / tau) for k in range(1, epochs + 1)]


def test_the_fit_recovers_an_exponential_curve():
    fit = fit_curve(flattening(20, tau=5.0))
    assert fit.a == pytest.approx(0.8, abs=0.02)
    assert fit.b == pytest.approx(2.0, rel=0.05)
    assert fit.tau == pytest.approx(5.0, rel=0.1)


def test_a_curve_too_short_or_not_finite_is_not_fitted():
    assert fit_curve([3.0, 2.0, 1.5]) is None
    assert fit_curve([3.0, 2.0, float("nan"), 1.0, 0.9]) is None
    assert stop_epoch([3.0, 2.0], 0.01) is None


def test_a_flattening_curve_is_predicted_to_stop_soon():
    # gain(k) = 2 e^(-k/3) (1 - e^(-1/3)) falls below 0.01 after epoch 3 ln(56.7) = 12.1
    assert stop_epoch(flattening(6), 0.01) == pytest.approx(13, abs=1)


def test_a_curve_that_keeps_improving_is_not_predicted_to_stop_soon():
    steady = [5.0 - 0.1 * k for k in range(1, 11)]
    assert stop_epoch(steady, 0.01) > 100


def test_a_curve_already_flat_stops_now():
    flat = flattening(40, tau=2.0)
    assert stop_epoch(flat, 0.01) == 40


def converged_models(forecast, count, epochs=12, tau=3.0):
    """`count` models whose curves stopped at `epochs`, each estimated at 10 epochs."""
    for k in range(count):
        curve = flattening(epochs, tau=tau)
        for epoch, value in enumerate(curve[:-1], start=1):
            forecast.observe_epoch(f"done{k}", epoch, value)
        forecast.observe_converged(f"done{k}", 10.0, epochs, curve[-1])


def test_curves_tell_a_flattening_model_from_one_that_keeps_improving():
    forecast = EpochForecast()
    converged_models(forecast, 3)
    for epoch, value in enumerate(flattening(6), start=1):
        forecast.observe_epoch("flat", epoch, value)
    for epoch in range(1, 7):
        forecast.observe_epoch("steep", epoch, 10.0 - 0.5 * epoch)
    assert forecast.remaining("flat", 30.0, 6) < 10  # its curve says so, whatever the estimate
    assert forecast.remaining("steep", 8.0, 6) > 20  # still improving fast: far past its estimate


def converge(forecast, model, curve, estimate, epochs):
    """Report ``curve`` up to ``epochs`` and converge ``model`` there against ``estimate``."""
    for epoch, value in enumerate(curve[: epochs - 1], start=1):
        forecast.observe_epoch(model, epoch, value)
    forecast.observe_converged(model, estimate, epochs, curve[epochs - 1])


def test_estimates_proven_exact_win_over_curves_that_mislead():
    # every curve has the same shape, but the models stop anywhere from epoch 8 to 24: the curve
    # cannot tell when, while each estimate was exact
    forecast = EpochForecast()
    stops = [8, 24, 10, 22, 12, 20, 14, 18, 16, 9, 23, 11, 21, 13, 19, 15, 17]
    for k, epochs in enumerate(stops[:14]):
        converge(forecast, f"m{k}", flattening(30), float(epochs), epochs)
    assert forecast.curve_trusted  # 11 models scored (the first 3 only taught the stop rule)
    for epoch, value in enumerate(flattening(6), start=1):
        forecast.observe_epoch("new", epoch, value)
    by_curve = forecast.remaining("new", 22.0, 6)
    converge(forecast, "m14", flattening(30), 15.0, 15)
    assert not forecast.curve_trusted  # 12 scored: the estimates' error is 0, the curve's is not
    assert forecast.remaining("new", 22.0, 6) == pytest.approx(16.0)  # the estimate, all ratios 1
    assert by_curve != pytest.approx(16.0)


def test_a_curve_stays_trusted_where_estimates_are_far_off():
    forecast = EpochForecast()
    for k in range(20):  # every model stops where its curve flattens, at 12; estimated at 7 or 20
        converge(forecast, f"m{k}", flattening(30), 7.0 if k % 2 else 20.0, 12)
    assert forecast.curve_trusted
    for epoch, value in enumerate(flattening(6), start=1):
        forecast.observe_epoch("new", epoch, value)
    assert forecast.remaining("new", 30.0, 6) == pytest.approx(6.0, abs=1.0)  # to 12, not to 30


def test_without_curves_the_estimate_holds_until_ratios_are_known():
    forecast = EpochForecast()
    assert forecast.remaining("a", 20.0, 5) == 15.0
    assert forecast.remaining("a", 20.0, 25) == 1.0  # past its estimate: one more epoch at a time
    forecast.observe_converged("b", 10.0, 13)
    forecast.observe_converged("c", 10.0, 7)
    assert forecast.remaining("a", 20.0, 5) == 15.0  # two ratios are not enough


def test_ratios_of_converged_models_rescale_the_estimate():
    forecast = EpochForecast()
    for k, epochs in enumerate((8, 10, 12, 14, 16)):
        forecast.observe_converged(f"m{k}", 10.0, epochs)
    assert forecast.ratios == [0.8, 1.0, 1.2, 1.4, 1.6]
    assert forecast.remaining("a", 20.0, 0) == pytest.approx(24.0)  # the median ratio, 1.2
    assert forecast.remaining("a", 20.0, 0, level=1.0) == pytest.approx(32.0)
    # past 25 of 20 estimated epochs: only ratios above 1.25 remain possible (1.4, 1.6)
    assert forecast.remaining("a", 20.0, 25) == pytest.approx(1.5 * 20 - 25)


def test_a_model_past_every_ratio_seen_needs_one_more_epoch():
    forecast = EpochForecast()
    for k in range(4):
        forecast.observe_converged(f"m{k}", 10.0, 10)
    assert forecast.remaining("a", 10.0, 10) == 1.0


def test_an_epoch_reported_again_after_a_checkpoint_replaces_the_old_value():
    forecast = EpochForecast()
    for epoch, value in enumerate(flattening(5), start=1):
        forecast.observe_epoch("a", epoch, value)
    forecast.observe_epoch("a", 5, 0.1)
    assert forecast.curves["a"][-1] == 0.1 and len(forecast.curves["a"]) == 5
    forecast.observe_epoch("a", 9, 0.1)  # a gap (no metric for 6..8): not appended
    assert len(forecast.curves["a"]) == 5
    forecast.observe_epoch("a", 6, None)
    assert len(forecast.curves["a"]) == 5



def test_remaining_of_many_models_is_remaining_of_each():
    forecast = EpochForecast()
    rng = np.random.default_rng(3)
    for k, (estimate, true) in enumerate(zip(rng.uniform(5, 40, 30), rng.integers(3, 60, 30))):
        forecast.observe_converged(f"done{k}", float(estimate), int(true))
    estimates = np.concatenate([rng.uniform(5, 40, 200), [0.0, 2.0]])
    done = np.concatenate([rng.integers(0, 80, 200), [3, 1]]).astype(float)
    ids = [f"m{k}" for k in range(done.size)]
    for level in (0.5, 0.9):
        expected = [forecast.remaining(m, e, d, level) for m, e, d in zip(ids, estimates.tolist(), done.tolist())]
        assert forecast.remaining_of(ids, estimates, done, level).tolist() == expected
