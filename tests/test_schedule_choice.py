"""`policy: auto` (fleet.schedule.choice): the candidate the simulator predicts to finish first."""

from __future__ import annotations

from fleet.schedule import Cluster, ModelState, RateTable, Scenario, create_policy, paper100, scale, simulate
from fleet.schedule.choice import (
    CANDIDATES,
    PREDICTION_BUDGET_S,
    PREDICTION_COSTS,
    PolicyChoice,
    affordable,
    choose_policy,
    pick,
    reconsider,
    simulation_cost_s,
)
from fleet.schedule.ledger import Ledger


def make(name: str):
    return create_policy(name, seed=0)


def test_it_runs_each_candidate_and_takes_the_fastest():
    scenario = paper100(0).scenario(40)
    choice = choose_policy(make, scenario)
    assert set(choice.predicted_s) == set(CANDIDATES)
    for name, seconds in choice.predicted_s.items():
        assert seconds == simulate(make(name), scenario, PREDICTION_COSTS).makespan
    assert choice.predicted_s[choice.name] == min(choice.predicted_s.values())
    assert choice.predicted_s[choice.name] < choice.predicted_s["baseline"]  # 100 models on 40 GPUs


def equal_rates(epochs: tuple[int, ...], gpus: int) -> Scenario:
    """Models of one rate (1,000 samples/s, no gain from a second GPU) and different lengths."""
    table = RateTable.from_dict({"schema": 1, "gpus_per_node": gpus, "samples_per_epoch": 1000, "models": [
        {"id": f"m{k}", "rates": {str(m): 1000.0 for m in range(1, gpus + 1)}} for k in range(len(epochs))]})
    return Scenario(table, epochs, tuple(map(float, epochs)), Cluster(gpus, gpus))


def test_fleet_g_is_not_taken_where_its_rounds_wait_for_their_longest_model():
    """Eight equally fast models of 1-4 epochs on 4 GPUs: FLEET-G's rounds wait for their longest
    member (15 s predicted), a policy that refills a freed GPU at once finishes in 5 s."""
    choice = choose_policy(make, equal_rates((1, 2, 3, 4, 1, 2, 3, 4), 4))
    assert choice.predicted_s["fleet-g"] > 2 * choice.predicted_s[choice.name]
    assert choice.name != "fleet-g" and choice.predicted_s[choice.name] == min(choice.predicted_s.values())


def test_ties_go_to_the_candidate_listed_first_and_describe_names_them_all():
    assert pick({name: 10.0 for name in CANDIDATES}).name == CANDIDATES[0]
    assert pick({"fleet-g": 12.0, "fleet-adaptive": 11.0, "fleet-l": 11.0, "homogeneous": 15.0,
                 "baseline": 20.0, "other": 1.0}).name == "fleet-adaptive"  # only candidates count
    text = PolicyChoice("fleet-l", {"fleet-g": 12.0, "fleet-l": 11.0}).describe()
    assert text == "fleet-l (predicted 11.0 s; fleet-g 12.0 s)"


def view_of(scenario: Scenario, done: dict[str, int] | None = None, converged: tuple[str, ...] = (),
            running: tuple[str, ...] = ()):
    """The driver's view at the start of `scenario`, with some epochs done, models converged
    and models running (each on its own GPU)."""
    ledger = Ledger(scenario.rates, list(scenario.epochs_estimate), scenario.cluster.total_gpus, scenario.cluster.gpus_per_node)
    for model, epochs in (done or {}).items():
        ledger.epoch_done(model, epochs)
    for model in converged:
        ledger.release(model, ModelState.CONVERGED)
    ledger.begin_launch()
    for gpu, model in enumerate(running):
        ledger.reserve(model, (gpu,), ledger.open_stream())
    return ledger.view(0.0)


def test_a_running_auto_hands_over_when_another_candidate_beats_it_by_more_than_the_margin_and_cost():
    """On the eight models of 1-4 epochs FLEET-G's rounds wait for their longest member: with
    nothing running, auto running FLEET-G switches to the candidate predicted first; one
    already running the best stays; so does FLEET-G when a switch would cost more than it saves."""
    scenario = equal_rates((1, 2, 3, 4, 1, 2, 3, 4), 4)
    switch = reconsider("fleet-g", view_of(scenario), make, PREDICTION_COSTS, CANDIDATES)
    best = choose_policy(make, scenario)
    assert switch is not None and (switch.current, switch.to) == ("fleet-g", best.name)
    assert switch.predicted_s == best.predicted_s and switch.cost_s == 0.0  # nothing runs: nothing to checkpoint
    assert "switching costs about 0.0 s" in switch.describe()
    assert reconsider(best.name, view_of(scenario), make, PREDICTION_COSTS, CANDIDATES) is None
    assert reconsider("fleet-g", view_of(scenario), make, PREDICTION_COSTS, ("fleet-g",)) is None
    busy = view_of(scenario, running=("m0", "m1"))
    assert reconsider("fleet-g", busy, make, PREDICTION_COSTS, CANDIDATES).cost_s > 0
    pair = ("fleet-adaptive", "fleet-l")  # predicted 5 s and 7 s
    assert reconsider("fleet-l", view_of(scenario), make, PREDICTION_COSTS, pair).to == "fleet-adaptive"
    assert reconsider("fleet-l", busy, make, PREDICTION_COSTS, pair) is None  # 5 s + 1.6 s of checkpoints > 0.9 x 7 s


def test_what_is_left_is_the_estimated_epochs_not_yet_done_of_the_unconverged_models():
    scenario = equal_rates((1, 2, 3, 4, 1, 2, 3, 4), 4)
    view = view_of(scenario, done={"m3": 3, "m7": 3, "m1": 1}, converged=("m0", "m4"))
    switch = reconsider("fleet-g", view, make, PREDICTION_COSTS, CANDIDATES)
    left = equal_rates((1, 1, 3, 2, 1, 1), 4)  # m1 2-1, m2 3, m3 4-3, m5 2, m6 3, m7 4-3, in table order
    rest = choose_policy(make, Scenario(left.rates, (1, 3, 1, 2, 3, 1), (1.0, 3.0, 1.0, 2.0, 3.0, 1.0), left.cluster))
    assert switch is not None and switch.predicted_s == rest.predicted_s


def test_candidates_too_large_to_simulate_in_the_budget_are_skipped_and_named():
    scenario = paper100(0).scenario(40)
    cost = {name: simulation_cost_s(name, scenario) for name in CANDIDATES}
    cheapest = sorted(CANDIDATES, key=cost.__getitem__)[:2]
    choice = choose_policy(make, scenario, budget_s=sum(cost[n] for n in cheapest))
    assert set(choice.predicted_s) == set(cheapest) and set(choice.skipped) == set(CANDIDATES) - set(cheapest)
    assert "not predicted, too large to simulate" in choice.describe()
    assert all(name in choice.describe() for name in choice.skipped)
    assert affordable(CANDIDATES, scenario, budget_s=0.0) == cheapest[:1]
    assert affordable(("mop", "fleet-hop"), scenario, budget_s=0.0) == ["mop", "fleet-hop"]  # not priced: kept


def test_auto_at_10000_models_on_10000_gpus_predicts_within_its_budget():
    scenario = scale(0, models=10_000).scenario(10_000)
    chosen = affordable(CANDIDATES, scenario)
    assert len(chosen) >= 2 and sum(simulation_cost_s(name, scenario) for name in chosen) <= PREDICTION_BUDGET_S
    assert "fleet-adaptive" not in chosen  # the dearest to simulate: minutes at this size
