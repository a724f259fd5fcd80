"""Early stopping across models in the driver, as every policy meets it, in the simulator.

The rung rules are `fleet.schedule.early_stop`'s (tests/test_schedule_early_stop.py); here the
driver carries its decisions out: a stopped model leaves its GPUs at the epoch of its rung, a
held one is checkpointed and holds no GPU until promoted, and every policy runs the survivors.
"""

from dataclasses import replace

import pytest

from fleet.schedule import (
    POLICIES,
    Cluster,
    ModelProfile,
    Overheads,
    RateTable,
    Scenario,
    create_policy,
    noisy_scenario,
    paper100,
    simulate,
)
from fleet.schedule.early_stop import EarlyStopSettings, Verdict
from fleet.schedule.sim_records import Outcome

WHOLE_DATA = sorted(name for name, cls in POLICIES.items() if not cls.hops)
HOPPING = sorted(name for name, cls in POLICIES.items() if cls.hops)
FREE = Overheads(latency_s=0.0, bandwidth=float("inf"), planning_s=0.0)


def curves_scenario(gpus: int, partitions: int = 0) -> Scenario:
    """24 paper100 models with stop-rule learning curves (what the rungs compare)."""
    scenario = noisy_scenario(paper100(3, models=24), gpus, 3, 0.3, "stop-rule")
    if partitions:
        n = scenario.rates.samples_per_epoch
        scenario = replace(scenario, partition_sizes=(n / partitions,) * partitions)
    return scenario


def settings(method: str, scenario: Scenario, **more) -> EarlyStopSettings:
    return EarlyStopSettings(method=method, max_epochs=max(scenario.true_epochs), **more)


def stops(result) -> dict[str, int]:
    """Each stopped model and the rung it was stopped at."""
    return {d.model: d.rung for d in result.rung_decisions if d.verdict is Verdict.STOPPED}


def check_each_model_ends_at_its_rung_or_its_own_end(scenario: Scenario, result) -> None:
    stopped = stops(result)
    for profile, true, trained in zip(scenario.rates.models, scenario.true_epochs, result.epochs_trained):
        assert trained == pytest.approx(stopped.get(profile.id, true)), profile.id
        assert trained <= true + 1e-9
    outcomes = {r.model for r in result.timeline.members if r.outcome is Outcome.STOPPED}
    assert outcomes <= set(stopped)  # a stop is at the epoch's end, not mid-epoch


@pytest.mark.parametrize("method", ["asha", "sha", "hyperband", "median"])
@pytest.mark.parametrize("policy", WHOLE_DATA)
def test_every_policy_honours_every_method(policy, method):
    scenario = curves_scenario(8)
    result = simulate(create_policy(policy, seed=1), scenario, FREE, early_stop=settings(method, scenario))
    assert not result.interrupted and stops(result)
    check_each_model_ends_at_its_rung_or_its_own_end(scenario, result)
    assert sum(result.epochs_trained) < 0.6 * sum(scenario.true_epochs)


@pytest.mark.parametrize("method", ["sha", "hyperband"])
def test_synchronous_halving_decides_the_same_whatever_the_policy(method):
    """sha waits for every model of a rung: who is stopped where does not depend on which
    policy ran them in which order, only on the curves."""
    scenario = curves_scenario(8)
    runs = [simulate(create_policy(p, seed=1), scenario, FREE, early_stop=settings(method, scenario))
            for p in WHOLE_DATA]
    assert all(stops(r) == stops(runs[0]) for r in runs)
    held = [d for d in runs[0].rung_decisions if d.verdict is Verdict.PAUSED]
    assert len(held) > 8  # more models waited at a rung than there are GPUs: held ones hold none


@pytest.mark.parametrize("method", ["asha", "sha"])
@pytest.mark.parametrize("policy", HOPPING)
def test_hopping_policies_honour_early_stopping_at_their_hops(policy, method):
    scenario = curves_scenario(8, partitions=2)
    result = simulate(create_policy(policy, seed=1), scenario, FREE, early_stop=settings(method, scenario))
    check_each_model_ends_at_its_rung_or_its_own_end(scenario, result)
    assert stops(result) and result.hops < 2 * sum(scenario.true_epochs)


def four_models(curves) -> Scenario:
    rates = RateTable(tuple(ModelProfile(m, (100.0,)) for m in "abcd"), 1, 100)
    epochs = (4, 4, 4, 4)
    return Scenario(rates, epochs, (4.0,) * 4, Cluster(2, 1), curves=tuple(curves))


def test_asha_on_two_gpus_by_hand():
    """Four models of equal speed on 2 GPUs, eta 2, rungs at 1 and 2 epochs. a and b train
    first and reach rung 1 together: a is the first recorded there (fewer than eta: it goes
    on), b is the better of two (0.5 against 0.9). c and d come next: c (0.4) is in the top 2
    of 4 and goes on, d (0.8, 3rd of 4) is stopped at 1 epoch. At rung 2 a again arrives first,
    b beats it, and c beats both: asynchronous halving stops only a late arrival that is not
    in the top half so far, so a, b and c train their 4 epochs."""
    curves = [(0.9, 0.85, 0.8, 0.7), (0.5, 0.45, 0.4, 0.35), (0.4, 0.3, 0.25, 0.2), (0.8, 0.7, 0.6, 0.5)]
    scenario = four_models(curves)
    result = simulate(create_policy("fleet-l"), scenario, FREE,
                      early_stop=EarlyStopSettings(method="asha", max_epochs=4, min_epochs=1, reduction=2))
    decided = [(d.model, d.rung, d.verdict, d.cutoff) for d in result.rung_decisions]
    assert decided == [
        ("a", 1, Verdict.CONTINUE, None), ("b", 1, Verdict.CONTINUE, 0.5),
        ("a", 2, Verdict.CONTINUE, None), ("b", 2, Verdict.CONTINUE, 0.45),
        ("c", 1, Verdict.CONTINUE, 0.4), ("d", 1, Verdict.STOPPED, 0.5),
        ("c", 2, Verdict.CONTINUE, 0.3),
    ]
    assert result.epochs_trained == (4, 4, 4, 1)


def test_the_checkpoint_signal_with_models_held_at_a_rung():
    scenario = curves_scenario(8)
    full = simulate(create_policy("fleet-g"), scenario, FREE, early_stop=settings("sha", scenario))
    cut = simulate(create_policy("fleet-g"), scenario, FREE, interrupt_at=full.makespan / 3,
                   early_stop=settings("sha", scenario))
    assert cut.interrupted and cut.makespan < full.makespan
    assert sum(cut.epochs_trained) < sum(full.epochs_trained)


@pytest.mark.parametrize("method", ["asha", "sha"])
def test_without_curves_about_one_in_eta_goes_on_past_each_rung(method):
    """A dry run has no learning curves: the simulator predicts how many models survive each
    rung (the rung arithmetic), not which. Unknown metrics all tied made ASHA's newcomer last,
    so only the first model went on past any rung; now about 1 in eta does, as for real metrics."""
    rates = RateTable(tuple(ModelProfile(f"m{i:02d}", (100.0,)) for i in range(64)), 1, 100)
    scenario = Scenario(rates, (8,) * 64, (8.0,) * 64, Cluster(8, 1))
    result = simulate(create_policy("fleet-g"), scenario, FREE, early_stop=EarlyStopSettings(method, 8, reduction=2))
    for rung in (1, 2, 4):
        here = {d.model: d.verdict for d in result.rung_decisions if d.rung == rung}  # the last verdict stands
        going_on = sum(v in (Verdict.CONTINUE, Verdict.PROMOTED) for v in here.values())
        assert 0.2 * len(here) <= going_on <= 0.8 * len(here) and going_on > 1, (rung, going_on, len(here))
    assert sum(result.epochs_trained) < 0.4 * 64 * 8


def test_the_stand_in_metric_ranks_rungs_only_and_never_reaches_the_policy():
    """Without curves, early stopping ranks by a stand-in; the policy's epochs still report no
    metric (fleet-adaptive fits its forecasts to reported metrics: a stand-in there changed its
    plans even without early stopping)."""
    rates = RateTable(tuple(ModelProfile(f"m{i:02d}", (100.0,)) for i in range(8)), 1, 100)
    scenario = Scenario(rates, (4,) * 8, (4.0,) * 8, Cluster(4, 1))
    for early in (None, EarlyStopSettings("asha", 4, reduction=2)):
        policy, seen = create_policy("fleet-adaptive"), []
        on_event = policy.on_event
        policy.on_event = lambda event, view: (seen.append(event), on_event(event, view))[1]
        result = simulate(policy, scenario, FREE, early_stop=early)
        metrics = [e.metric for e in seen if type(e).__name__ == "EpochCompleted"]
        assert metrics and all(m is None for m in metrics)
        assert bool(result.rung_decisions) == (early is not None)


def test_an_epoch_that_ends_as_its_model_is_checkpointed_is_decided_before_the_model_comes_back():
    """Stream-mates end their epochs at one instant; the first one's event ends the round and
    checkpoints the others at exactly their epoch's end. The runtime's master reports that
    epoch before it leaves, so its rung is decided then: no model is launched again only to
    be stopped at once (a relaunch with no epoch trained, which cost a restore and a round)."""
    rates = RateTable(tuple(ModelProfile(f"m{i:02d}", (3000.0 + 100 * i, 5000.0, 6500.0)) for i in range(8)), 3, 1400)
    scenario = Scenario(rates, (6,) * 8, (6.0,) * 8, Cluster(3, 3))
    result = simulate(create_policy("fleet-g"), scenario, Overheads(latency_s=0.5),
                      early_stop=EarlyStopSettings("asha", 6, reduction=2))
    for member in result.timeline.members:
        assert member.epochs_end > member.epochs_start or member.outcome is not Outcome.STOPPED, member
    check_each_model_ends_at_its_rung_or_its_own_end(scenario, result)
