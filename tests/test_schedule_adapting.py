"""The driver's adapter (`fleet.schedule.adapting`): measured rates weighed and adopted where
they pay, and ``policy: auto`` reconsidered, in the simulator as in the runtime."""

import pytest

import switch_case
from fleet.runtime.control.rates_source import estimated_profile
from fleet.schedule import Cluster, ModelState, Overheads, RateTable, Scenario, create_policy, simulate
from fleet.schedule._base import ModelConverged
from fleet.schedule.adapting import RateTuner, simulate_auto, simulation_adapter
from fleet.schedule.early_stop import EarlyStopSettings
from fleet.schedule.sim_records import Outcome, SwitchRecord
from fleet.schedule.ledger import Ledger
from fleet.spec import parse_spec


def rates3() -> RateTable:
    return RateTable.from_dict({"schema": 1, "gpus_per_node": 2, "samples_per_epoch": 100, "models": [
        {"id": m, "rates": {"1": r, "2": 1.8 * r}} for m, r in (("a", 100), ("b", 90), ("c", 50))]})


class RecordingNotes:
    """`AdaptNotes` that keep the names of what they were told."""

    def __init__(self):
        self.logged, self.switches = [], []

    def rates_refined(self, changes, verdict):
        self.logged.append("rates_refined")

    def rates_kept(self, verdict):
        self.logged.append("rates_kept")

    def policy_switched(self, switch, at):
        self.logged.append("policy_switch")
        self.switches.append((at, switch))


def rate_tuner(policy_name: str, checkpoint_s: float, rates: RateTable | None = None,
               epochs: tuple = (3, 3, 3)) -> RateTuner:
    """A `RateTuner` over a real ledger and policy, its log recorded, at a save cost of `checkpoint_s`."""
    rates = rates or rates3()
    ledger = Ledger(rates, epochs, total_gpus=4, gpus_per_node=rates.gpus_per_node)
    costs = Overheads(latency_s=checkpoint_s, bandwidth=float("inf"), planning_s=0.0)
    return RateTuner(ledger, create_policy(policy_name), lambda: create_policy(policy_name), lambda: costs,
                     RecordingNotes())


def test_measured_rates_are_weighed_only_where_they_can_change_a_plan_and_once_within_ten_percent():
    # baseline and homogeneous never read a rate; fleet-adaptive rescales its own curves by
    # each epoch's measured rate: the coordinator's weighing could not change their plans
    for name in ("baseline", "homogeneous", "fleet-adaptive"):
        blind = rate_tuner(name, checkpoint_s=0.0)
        blind.observe("a", 1, 25.0)
        blind.refine(0.0)
        assert blind.notes.logged == [] and blind.ledger.rates == rates3()
    costly = rate_tuner("fleet-g", checkpoint_s=1e6)  # no gain pays for the change
    costly.observe("a", 1, 25.0)
    costly.refine(0.0)
    assert costly.notes.logged == ["rates_kept"] and costly.ledger.rates == rates3()
    costly.observe("a", 1, 26.0)  # the proposal moves by 2%: the same verdict, not simulated again
    costly.refine(0.0)
    assert costly.notes.logged == ["rates_kept"]
    costly.observe("a", 1, 5.0)  # now by a third: weighed again
    costly.refine(0.0)
    assert costly.notes.logged == ["rates_kept", "rates_kept"] and costly.seconds > 0


def test_fleet_hop_takes_measured_rates_unweighed_at_its_hops():
    """Every visit ends with a checkpoint and is planned afresh: new rates cost nothing."""
    tuner = rate_tuner("fleet-hop", checkpoint_s=1e6)  # a weighing could never pay for a change
    tuner.observe("a", 1, 25.0)
    tuner.refine(0.0)
    assert tuner.notes.logged == ["rates_refined"] and tuner.ledger.rates.rate("a", 1) == 25.0
    assert tuner.seconds == 0  # nothing simulated
    tuner.observe("a", 1, 25.5)  # within 10% of the table: nothing to adopt
    tuner.refine(0.0)
    assert tuner.notes.logged == ["rates_refined"]
    mop = rate_tuner("mop", checkpoint_s=0.0)  # draws at random: never reads a rate
    mop.observe("a", 1, 25.0)
    mop.refine(0.0)
    assert mop.notes.logged == [] and mop.ledger.rates == rates3()


def test_estimated_rates_measure_models_that_train_alike_as_one():
    """A sweep's copies of one architecture (they differ in learning rate) get one estimated rate
    and are measured as one, as the profiler would time them: noise in their epoch reports
    cannot pull them apart (and out of one shared stream)."""
    spec = parse_spec({"name": "s", "data": {"source": "digits"}, "models": [
        {"family": "mlp", "name": "slow", "train": {"lr": 0.1}},
        {"family": "mlp", "name": "fast", "train": {"lr": 0.01}},
        {"family": "mlp", "name": "wide", "params": {"hidden": [512]}}]})
    rates = RateTable.from_dict(estimated_profile(spec, 1000, {"slow": 1000, "fast": 1000, "wide": 5000}))
    assert [p.extra.get("timed_as") for p in rates.models] == [None, "slow", None]
    tuner = RateTuner(Ledger(rates, (3, 3, 3), total_gpus=2, gpus_per_node=1), create_policy("fleet-hop"),
                      lambda: create_policy("fleet-hop"), Overheads, RecordingNotes())
    tuner.observe("slow", 1, 40.0)
    tuner.observe("fast", 1, 60.0)
    tuner.refine(0.0)
    assert tuner.ledger.rates.rate("slow", 1) == tuner.ledger.rates.rate("fast", 1) == pytest.approx(50.0)


def test_fleet_g_s_rates_are_weighed_only_once_its_cluster_is_drained():
    """FLEET-G plans only when no model runs or checkpoints: a weighing before then is wasted."""
    tuner = rate_tuner("fleet-g", checkpoint_s=0.01)
    ledger = tuner.ledger
    ledger.begin_launch()
    stream = ledger.open_stream()
    ledger.reserve("a", (0,), stream)
    ledger.reserve("b", (1,), stream)
    tuner.observe("b", 1, 22.0)
    ledger.release("a", ModelState.CONVERGED)
    tuner.refine(0.0)  # b still runs
    ledger.start_checkpoint("b")
    tuner.refine(0.0)  # b still saves
    assert tuner.notes.logged == [] and tuner.seconds == 0
    ledger.release("b", ModelState.PAUSED)
    tuner.refine(0.0)
    assert tuner.notes.logged in (["rates_refined"], ["rates_kept"]) and tuner.seconds > 0


def test_fleet_g_s_rates_are_weighed_only_when_they_change_the_plan_about_to_be_made():
    tuner = rate_tuner("fleet-g", checkpoint_s=0.01)
    tuner.observe("b", 1, 100.0)  # 11% faster than profiled: still matched with a
    tuner.refine(0.0)
    assert tuner.notes.logged == [] and tuner.rejected is None and tuner.ledger.rates == rates3()
    tuner.observe("b", 1, 40.0)  # averaged, 70: b no longer runs at a's side
    tuner.refine(0.0)
    assert tuner.notes.logged in (["rates_refined"], ["rates_kept"])


def test_measured_rates_are_weighed_at_the_checkpoint_cost_the_run_measured():
    """b trains 11% slower than profiled: planned on that, FLEET-G's schedule is 0.24 s shorter but
    has two rounds more. At this run's 0.05-s saves that pays; the simulator's default costs (a
    cluster's 5 s per checkpoint and per restore) would have priced each extra round at ~10 s."""
    rates = RateTable.from_dict({"schema": 1, "gpus_per_node": 4, "samples_per_epoch": 1000, "models": [
        {"id": m, "rates": {str(k + 1): r * f for k, f in enumerate((1.0, 1.8, 2.4, 2.8))}}
        for m, r in (("a", 200), ("b", 200), ("c", 400))]})
    tuner = rate_tuner("fleet-g", checkpoint_s=0.05, rates=rates, epochs=(4, 2, 4))
    tuner.observe("b", 1, 178.0)
    tuner.refine(0.0)
    assert tuner.notes.logged == ["rates_refined"] and tuner.ledger.rates.rate("b", 1) == 178.0
    fresh = rate_tuner("fleet-g", checkpoint_s=0.05, rates=rates, epochs=(4, 2, 4))
    fresh.observe("b", 1, 178.0)
    _, verdict = fresh.weigh(0.0)
    assert verdict.cost_s == pytest.approx(0.1)  # one model moved: a save and a restore
    assert 0.1 < verdict.gain_s < 1.0, verdict


def switch_scenario(true_rates=switch_case.TRUE) -> Scenario:
    """The six models of `switch_case` on 4 GPUs, planned on its wrong profile."""
    planned = RateTable.from_dict(switch_case.profile(switch_case.PLANNED, 1438))
    truth = RateTable.from_dict(switch_case.profile(true_rates, 1438))
    epochs = tuple(switch_case.EPOCHS.values())
    return Scenario(truth, epochs, tuple(map(float, epochs)), Cluster(4, 4), planning_rates=planned)


def test_the_simulator_predicts_the_policy_switch_measured_rates_make():
    """Planned on the wrong profile, auto takes fleet-l; the first convergence reports rates
    that make fleet-g far faster, and the simulated run hands over there, as the runtime does
    (test_profiler_mpi.py runs the same case under mpiexec). Where the profile was right,
    nothing moves and auto keeps its choice."""
    cheap = Overheads(latency_s=0.02, bandwidth=float("inf"))
    choice, result = simulate_auto(lambda name: create_policy(name, seed=0), switch_scenario(), cheap)
    first_convergence = min(r.end for r in result.timeline.members if r.outcome is Outcome.CONVERGED)
    assert choice.name == "fleet-l"
    assert result.switches == (SwitchRecord(first_convergence, "fleet-l", "fleet-g"),)
    assert result.policy == "fleet-g" and result.epochs_trained == tuple(switch_case.EPOCHS.values())
    kept, steady = simulate_auto(lambda name: create_policy(name, seed=0), switch_scenario(switch_case.PLANNED), cheap)
    assert kept.name == "fleet-l" and steady.switches == () and steady.rates_adopted == 0


def test_a_simulated_run_adopts_the_rates_it_measures_where_the_weighing_says_it_pays():
    """fleet-g planned on the wrong profile, adapting as a run does: the weighing at a round's
    end adopts the measured rates, and the rounds after it are planned on them."""
    cheap = Overheads(latency_s=0.02, bandwidth=float("inf"))
    scenario = switch_scenario()
    blind = simulate(create_policy("fleet-g"), scenario, cheap)
    adapting = simulate(create_policy("fleet-g"), scenario, cheap, adapt=simulation_adapter(create_policy))
    assert blind.rates_adopted == 0 and adapting.rates_adopted >= 1 and adapting.switches == ()
    assert [r.members for r in adapting.timeline.streams] != [r.members for r in blind.timeline.streams]


class SwitchAtConvergence:
    """An adapter that hands the run to `to` at its `k`-th convergence, as ``policy: auto``
    may on measured rates (what it weighs does not matter here: the hand-over does)."""

    seconds, switches = 0.0, []

    def __init__(self, k: int, to: str):
        self.k, self.to, self.seen = k, to, 0

    def observe(self, *args):
        pass

    def part(self, *args):
        pass

    def before_policy(self, event, driver):
        if isinstance(event, ModelConverged):
            self.seen += 1
            if self.seen == self.k:
                driver.switch_policy(create_policy(self.to, seed=0))


def twelve_models_on_two_nodes() -> Scenario:
    """12 models of mixed rates, 6 epochs each, with metric curves for early stopping."""
    rates = [700, 1500, 900, 2600, 1100, 480, 3000, 820, 1900, 640, 1300, 2200]
    table = RateTable.from_dict({"schema": 1, "gpus_per_node": 4, "samples_per_epoch": 2000, "models": [
        {"id": f"m{i:02d}", "rates": {str(m): r * m * 0.85 ** (m - 1) for m in range(1, 5)}}
        for i, r in enumerate(rates)]})
    curves = tuple(tuple(1.0 / (e + 1) + 0.07 * ((3 * i + 5 * e) % 7) for e in range(6)) for i in range(12))
    return Scenario(table, (6,) * 12, (6.0,) * 12, Cluster(2, 4), curves=curves)


@pytest.mark.parametrize("start", ["fleet-adaptive", "fleet-l", "homogeneous", "baseline"])
@pytest.mark.parametrize("to", ["baseline", "homogeneous"])
@pytest.mark.parametrize("method", ["asha", "sha", None])
def test_a_run_handed_to_a_queueing_policy_launches_only_the_models_still_waiting(start, to, method):
    """Baseline and homogeneous queue the models at their start. Handed a run mid-way, that
    start sees converged models, paused ones that early stopping may then stop, hold or
    promote (queuing them again): none of those may be launched, and every model still ends."""
    early = EarlyStopSettings(method, 6, reduction=2) if method else None
    for k in (1, 3, 6):
        adapter = SwitchAtConvergence(k, to)
        result = simulate(create_policy(start, seed=0), twelve_models_on_two_nodes(),
                          Overheads(latency_s=0.02, bandwidth=float("inf")),
                          adapt=lambda *args: adapter, early_stop=early)
        assert adapter.seen >= k
        assert all(epochs >= 1 - 1e-9 for epochs in result.epochs_trained)
        assert not result.interrupted
