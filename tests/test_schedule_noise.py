"""The simulator's noise models and the scale workload (fleet.schedule.noise, workloads.scale)."""

import numpy as np
import pytest

from fleet.schedule import (
    EpochCompleted,
    NO_DECISION,
    Overheads,
    create_policy,
    noisy_estimates,
    noisy_scenario,
    paper100,
    scale,
    simulate,
)
from fleet.schedule.noise import curve_tau, learning_curve, stop_rule_epoch, stop_rule_truth


def test_the_stop_rule_fires_after_patience_epochs_without_a_big_enough_improvement():
    assert stop_rule_epoch([5, 4, 3, 2.999, 2.998, 2.997], patience=3, min_delta=0.01) == 6
    assert stop_rule_epoch([5, 4, 3, 2.995, 2.5, 2.495, 2.495, 2.495], patience=3, min_delta=0.01) == 8
    assert stop_rule_epoch([5, 4, 3, 2.995, 2.99, 2.98], patience=3, min_delta=0.01) is None  # 3 - 2.98 > 0.01
    assert stop_rule_epoch([5, 4, 3, 2], patience=3, min_delta=0.01) is None


@pytest.mark.parametrize("epochs", [1, 5, 10, 25, 40])
def test_a_noise_free_curve_stops_at_its_target_or_just_after(epochs):
    tau = curve_tau(epochs, amp=2.0)
    k = np.arange(1, 4 * epochs + 10)
    stop = stop_rule_epoch(2.0 * np.exp(-k / tau))
    assert max(epochs, 4) <= stop <= max(epochs, 4) + 3  # patience 3: never before epoch 4


def test_noisy_curves_stop_near_their_targets():
    targets = paper100(0).true_epochs
    truth, curves = stop_rule_truth(targets, seed=0)
    ratios = np.array(truth) / np.array(targets)
    assert 0.85 < ratios.mean() < 1.1 and ratios.min() > 0.6 and ratios.max() < 1.5
    assert all(len(c) >= t for c, t in zip(curves, truth))
    assert stop_rule_truth(targets, seed=0) == (truth, curves)  # seeded


def test_a_learning_curve_falls_and_flattens():
    curve = np.array(learning_curve(20, np.random.default_rng(1), 60))
    assert curve[0] - curve[10] > 10 * abs(curve[40] - curve[50])


def test_the_uniform_model_is_the_estimates_of_before():
    workload = paper100(2)
    scenario = noisy_scenario(workload, 40, 2, 0.3)
    assert scenario == workload.scenario(40, noisy_estimates(workload.true_epochs, 2, 0.3))
    assert noisy_scenario(workload, 40, 2, 0.0) == workload.scenario(40)


def test_the_stop_rule_model_reports_each_epochs_loss():
    workload = paper100(1, models=8)
    scenario = noisy_scenario(workload, 8, 1, 0.3, "stop-rule")
    seen = []

    class Watching(type(create_policy("baseline"))):
        def on_epoch(self, event: EpochCompleted, view):
            seen.append((event.model, event.epoch, event.metric))
            return NO_DECISION

    simulate(Watching(), scenario, Overheads())
    index = {m: i for i, m in enumerate(scenario.rates.ids)}
    assert seen and all(metric == scenario.curves[index[m]][e - 1] for m, e, metric in seen)
    with pytest.raises(ValueError, match="noise model"):
        noisy_scenario(workload, 8, 1, 0.3, "gaussian")


def test_the_scale_workload_is_seeded_and_sized():
    a, b = scale(3, models=300, gpus_per_node=8), scale(3, models=300, gpus_per_node=8)
    assert a == b and len(a.rates.models) == 300 and a.rates.gpus_per_node == 8
    single = np.array([p.rates[0] for p in a.rates.models])
    assert single.min() >= 21 * 0.999 and single.max() <= 176 * 1.001
    assert min(a.true_epochs) >= 10 and max(a.true_epochs) <= 40
    slow, fast = np.argmin(single), np.argmax(single)
    assert a.rates.models[slow].param_bytes > a.rates.models[fast].param_bytes
    assert scale(4, models=300).true_epochs != a.true_epochs
