"""`policy: auto` (fleet.schedule.choice): the candidate the simulator predicts to finish first."""

from __future__ import annotations

from fleet.schedule import Cluster, RateTable, Scenario, create_policy, paper100, simulate
from fleet.schedule.choice import CANDIDATES, PREDICTION_COSTS, PolicyChoice, choose_policy, pick


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
