"""The workload family (fleet.schedule.workload_family): seeded instances, parameters in their
ranges, cells that fix some of them, and issue 46's table as the ``issue`` shape."""

import math

import numpy as np
import pytest

from fleet.schedule import lower_bounds
from fleet.schedule.workload_family import (
    CROSS_NODE_RANGE,
    EPOCH_SHAPES,
    GPUS_PER_NODE_CHOICES,
    HEAVY_MAX_EPOCHS,
    HEAVY_MIN_EPOCHS,
    LONG_EPOCHS,
    PROFILE_DEPTHS,
    RATIO_RANGE,
    REPORTING_SEEDS,
    SAMPLES_PER_EPOCH,
    SCALING_CLASSES,
    SHAPES,
    SHORT_EPOCHS,
    SIGMA_RANGE,
    TUNING_SEEDS,
    FamilyCell,
    FamilyError,
    draw_parameters,
    family_instance,
)


def test_an_instance_is_the_same_for_the_same_seed_and_cell_and_differs_for_another_seed():
    cell = FamilyCell("bimodal", 0.5, 8)
    one, again = family_instance(1003, 40, cell), family_instance(1003, 40, cell)
    assert one == again
    assert one.workload.rates.to_dict() == again.workload.rates.to_dict()
    other = family_instance(1004, 40, cell)
    assert other.workload.rates.to_dict() != one.workload.rates.to_dict()


def test_tuning_and_reporting_seeds_never_overlap():
    assert not set(TUNING_SEEDS) & set(REPORTING_SEEDS)
    assert len(REPORTING_SEEDS) >= 10


@pytest.mark.parametrize("seed", range(1000, 1040))
def test_drawn_parameters_lie_in_their_ranges(seed):
    for shape in EPOCH_SHAPES:
        p = draw_parameters(seed, 50, FamilyCell(shape))
        assert SIGMA_RANGE[0] <= p.sigma <= SIGMA_RANGE[1]
        assert CROSS_NODE_RANGE[0] <= p.cross_node <= CROSS_NODE_RANGE[1]
        assert RATIO_RANGE[0] <= p.gpus_ratio <= RATIO_RANGE[1] and p.gpus == max(1, round(p.gpus_ratio * 50))
        assert p.gpus_per_node in GPUS_PER_NODE_CHOICES and p.profile_depth in PROFILE_DEPTHS
        assert len(p.scaling_mix) == len(SCALING_CLASSES) and math.isclose(sum(p.scaling_mix), 1.0)
        assert (p.long_share > 0) == (shape == "bimodal") and (p.tail_alpha > 0) == (shape == "heavy")


def test_a_cell_fixes_its_parameters_and_leaves_the_others_drawn_alike():
    free, fixed = draw_parameters(1010, 300, FamilyCell("uniform")), draw_parameters(1010, 300, FamilyCell("uniform", 2.0, 6))
    assert (fixed.gpus_ratio, fixed.gpus, fixed.gpus_per_node) == (2.0, 600, 6)
    assert (fixed.sigma, fixed.scaling_mix, fixed.cross_node) == (free.sigma, free.scaling_mix, free.cross_node)
    assert draw_parameters(1010, 300, FamilyCell("heavy")).sigma == free.sigma  # one seed, one draw in every cell


@pytest.mark.parametrize("seed", [1000, 1001, 1002])
def test_rates_follow_the_scaling_law_with_the_cross_node_penalty_and_eq5_beyond(seed):
    instance = family_instance(seed, 30, FamilyCell("uniform", 1.0, 4))
    p, table = instance.parameters, instance.workload.rates
    depth = {"node": 4, "two-nodes": 8}.get(p.profile_depth, table.threshold_gpus())
    low = min(r for r, _ in SCALING_CLASSES.values())
    high = max(r for _, r in SCALING_CLASSES.values())
    for model in table.models:
        assert len(model.rates) == depth and model.param_bytes > 0
        r1 = model.rates[0]
        eff = model.rates[1] / (2 * r1)
        assert low - 1e-3 <= eff <= high + 1e-3
        r4 = r1 * 4 * eff**2
        assert model.rates[3] == pytest.approx(r4, rel=1e-3)
        if depth > 4:
            assert model.rates[4] == pytest.approx(r1 * 5 * eff ** math.log2(5) * p.cross_node, rel=1e-3)
    assert table.samples_per_epoch == SAMPLES_PER_EPOCH and table.gpus_per_node == 4
    assert np.all(np.isfinite(table.matrix(4 * depth)))  # Eq. 5 past the profile


def test_each_epochs_shape_draws_its_distribution():
    def epochs(shape):
        return np.array(family_instance(1001, 400, FamilyCell(shape)).workload.true_epochs)

    uniform, bimodal, heavy = epochs("uniform"), epochs("bimodal"), epochs("heavy")
    assert uniform.min() >= 5 and uniform.max() <= 60 and np.std(uniform) > 10
    assert set(bimodal) <= set(range(SHORT_EPOCHS[0], SHORT_EPOCHS[1] + 1)) | set(range(LONG_EPOCHS[0], LONG_EPOCHS[1] + 1))
    assert (bimodal >= LONG_EPOCHS[0]).any() and (bimodal <= SHORT_EPOCHS[1]).any()
    assert heavy.min() >= HEAVY_MIN_EPOCHS and heavy.max() <= HEAVY_MAX_EPOCHS
    assert heavy.max() > 4 * np.median(heavy)  # a tail: a few models many times the median


def test_the_issue_shape_is_issue_46s_table():
    instance = family_instance(1005, 200, FamilyCell("issue", 0.64, 4))
    p, table = instance.parameters, instance.workload.rates
    assert (p.sigma, p.cross_node, p.profile_depth, p.scaling_mix) == (0.6, 0.93, "two-nodes", (0.0, 1.0, 0.0))
    assert p.gpus == 128
    single = np.log([m.rates[0] for m in table.models])
    assert abs(np.median(single) - math.log(80)) < 0.15 and 0.5 < np.std(single) < 0.7
    effs = np.array([m.rates[1] / (2 * m.rates[0]) for m in table.models])
    assert effs.min() >= 0.75 - 1e-3 and effs.max() <= 0.97 + 1e-3
    assert all(len(m.rates) == 8 for m in table.models)
    epochs = instance.workload.true_epochs
    assert min(epochs) >= 5 and max(epochs) <= 60
    scenario = instance.scenario()
    assert scenario.cluster.total_gpus == 128 and lower_bounds(table, epochs, 128).lb2 > 0


@pytest.mark.parametrize(
    "make, field",
    [
        (lambda: FamilyCell("lognormal"), "shape"),
        (lambda: FamilyCell("issue", 3.0), "gpus_ratio"),
        (lambda: FamilyCell("issue", 0.1), "gpus_ratio"),
        (lambda: FamilyCell("issue", float("nan")), "gpus_ratio"),
        (lambda: FamilyCell("issue", None, 5), "gpus_per_node"),
        (lambda: draw_parameters(1000, 0), "models"),
    ],
)
def test_a_parameter_out_of_its_range_names_itself(make, field):
    with pytest.raises(FamilyError) as caught:
        make()
    assert caught.value.field == field and str(caught.value).startswith(f"{field}: ")


def test_every_shape_builds():
    for shape in SHAPES:
        instance = family_instance(1000, 12, FamilyCell(shape))
        assert len(instance.workload.true_epochs) == 12 and instance.workload.name.startswith(f"family-{shape}")
