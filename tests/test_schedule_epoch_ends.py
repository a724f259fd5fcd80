"""The ends of epochs (validation pass, save) in the rates predictions plan with."""

import pytest
from fleet.prediction import planned_rates
from fleet.schedule.calibration import Calibration
from fleet.schedule.epoch_ends import validation_per_sample, with_epoch_ends
from fleet.schedule.rates import RateTable
from fleet.spec import parse_spec

N = 9000  # training samples of an epoch


def _table(*models: dict) -> RateTable:
    return RateTable.from_dict({"schema": 1, "gpus_per_node": 4, "samples_per_epoch": N, "models": list(models)})


def test_an_epoch_lasts_its_steps_its_validation_pass_and_its_save():
    table = _table({"id": "a", "rates": {"1": 1000.0, "2": 1800.0}, "eval_rate": 3000.0, "checkpoint_s": 0.5})
    ended = with_epoch_ends(table, validation=0.1)
    end_s = N * 0.1 / 3000.0 + 0.5
    assert ended.rate("a", 1) == pytest.approx(N / (N / 1000.0 + end_s))
    assert ended.rate("a", 2) == pytest.approx(N / (N / 1800.0 + end_s))  # the end does not shrink with trainers
    assert ended.samples_per_epoch == N and ended.models[0].extra["eval_rate"] == 3000.0


def test_an_untimed_model_takes_the_timed_ones_median_cost_of_a_validation_pass():
    table = _table({"id": "a", "rates": {"1": 1000.0}, "eval_rate": 2000.0, "checkpoint_s": 0.2},
                   {"id": "b", "rates": {"1": 500.0}, "eval_rate": 2000.0, "checkpoint_s": 0.4},
                   {"id": "c", "rates": {"1": 100.0}})
    ended = with_epoch_ends(table, validation=0.25)
    ratio = (1000.0 / 2000.0 + 500.0 / 2000.0) / 2  # steps per validation sample's cost, the median of two
    assert ended.rate("c", 1) == pytest.approx(N / (N / 100.0 + N * 0.25 / (100.0 / ratio) + 0.3))


def test_models_of_groups_end_an_epoch_of_their_own_samples():
    table = _table({"id": "g", "rates": {"1": 1000.0}, "eval_rate": 4000.0, "checkpoint_s": 0.1})
    ended = with_epoch_ends(table, validation=0.1, scales={"g": 10.0})
    n = N / 10
    assert ended.rate("g", 1) == pytest.approx(n / (n / 1000.0 + n * 0.1 / 4000.0 + 0.1))


def test_a_profile_that_timed_no_validation_is_taken_as_it_is():
    table = _table({"id": "a", "rates": {"1": 1000.0}, "checkpoint_s": 0.5})
    assert with_epoch_ends(table, validation=0.1) is table


def test_validation_samples_per_training_sample_of_a_split():
    assert validation_per_sample(0.1) == pytest.approx(0.1 / 0.9)
    assert validation_per_sample(0.2, 0.1) == pytest.approx(0.2 / 0.7)


def test_predictions_take_the_timed_ends_unless_a_run_measured_them():
    spec = parse_spec({"name": "x", "data": {"source": "digits", "val_fraction": 0.2},
                       "models": [{"family": "resnet"}]})
    model = spec.models[0].id
    table = _table({"id": model, "rates": {"1": 1000.0}, "eval_rate": 2000.0, "checkpoint_s": 0.5})
    timed = planned_rates(table, spec, None, {})
    assert timed.rate(model, 1) == pytest.approx(N / (N / 1000.0 + N * 0.25 / 2000.0 + 0.5))
    # an earlier run's measured share of its epochs' ends stands in for the timed ones
    measured = Calibration("a run", epoch_end_share=0.1)
    assert planned_rates(table, spec, measured, {}).rate(model, 1) == 1000.0
