"""A run's forecast of itself: the simulated makespan and a range from the rates' uncertainty."""

import pytest

from fleet.schedule import Cluster, ModelProfile, Overheads, RateTable, Scenario, create_policy, simulate
from fleet.schedule.predicted import forecast_run, scaled_rates

FREE = Overheads(latency_s=0.0, bandwidth=float("inf"), planning_s=0.0)


def scenario(models: int = 12, gpus: int = 4) -> Scenario:
    rates = RateTable(tuple(ModelProfile(f"m{i:02d}", (100.0 + 10 * i, 180.0 + 15 * i)) for i in range(models)), 2, 1000)
    return Scenario(rates, (3,) * models, (3.0,) * models, Cluster(gpus, 2))


def test_the_forecast_is_the_simulated_makespan_inside_a_range_from_the_rates_spread():
    s = scenario()
    exact = simulate(create_policy("fleet-g"), s, FREE).makespan
    forecast = forecast_run(lambda: create_policy("fleet-g"), s, FREE, spread=0.3, draws=12)
    assert forecast.policy == "fleet-g" and forecast.makespan_s == pytest.approx(exact) and forecast.draws == 12
    # rates off the table also cost mis-planning (the policy plans with the table): the range
    # lies mostly above the exact simulation, within what +-30 % per model can do
    assert 0.7 * exact < forecast.low_s < forecast.high_s < 1.5 * exact and exact < forecast.high_s
    narrow = forecast_run(lambda: create_policy("fleet-g"), s, FREE, spread=0.05, draws=12)
    assert narrow.high_s - narrow.low_s < forecast.high_s - forecast.low_s
    record = forecast.to_record()
    assert record["range_s"] == [forecast.low_s, forecast.high_s] and record["rate_spread"] == 0.3


def test_candidates_are_kept_and_the_draws_stop_at_their_budget():
    forecast = forecast_run(lambda: create_policy("baseline"), scenario(), FREE, spread=0.1, draws=50, budget_s=0.0,
                            candidates={"baseline": 123.0, "fleet-g": 150.0})
    assert forecast.candidates == {"baseline": 123.0, "fleet-g": 150.0}
    assert forecast.draws == 1  # the first draw always runs; the budget stops the rest


def test_the_predicted_gantt_holds_every_stay_of_the_simulated_run():
    s = scenario(models=5, gpus=2)
    forecast = forecast_run(lambda: create_policy("baseline"), s, FREE, spread=0.1, draws=1)
    gantt = forecast.gantt_record()
    assert gantt["policy"] == "baseline" and gantt["makespan_s"] == forecast.makespan_s
    assert sorted(m["model"] for m in gantt["members"]) == [f"m{i:02d}" for i in range(5)]
    assert max(m["end"] for m in gantt["members"]) == pytest.approx(forecast.makespan_s)
    first = min(gantt["members"], key=lambda m: m["start"])
    assert first["start"] == 0.0 and len(first["gpus"]) == 1 and first["epochs"] == [0.0, 3.0]
    assert first["outcome"] == "converged" and gantt["rounds"]


def test_scaled_rates_scale_each_model_by_its_factor():
    rates = scenario(3).rates
    scaled = scaled_rates(rates, [1.0, 0.5, 2.0])
    assert [p.rates for p in scaled.models] == [rates.models[0].rates, (55.0, 97.5), (240.0, 420.0)]
