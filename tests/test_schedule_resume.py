"""Interrupted and resumed runs in the simulator: every policy, any number of times, from any
mix of converged, partly trained and untouched models.

A run is stopped by the checkpoint signal at a random moment (every running model is
checkpointed, as the runtime does), then started again from its checkpoints with a fresh
policy, until every model converged. Each model must train exactly its epochs in all, no run
may stall, and the policies that refill GPUs at once (baseline, fleet-l, fleet-adaptive) may
never leave a GPU idle while a model waits that they could run.
"""

import math

import numpy as np
import pytest

from fleet.schedule import (
    POLICIES,
    Cluster,
    ClusterView,
    Decision,
    ModelProfile,
    ModelState,
    Overheads,
    Policy,
    RateTable,
    Scenario,
    create_policy,
    paper100,
    simulate,
)
from fleet.schedule.costs import FREE
from fleet.schedule.simulator import resumed_scenario

# refill released GPUs at once; FLEET-G and Homogeneous wait for their rounds by design
WORK_CONSERVING = {"baseline", "fleet-l", "fleet-adaptive"}


class Watched(Policy):
    """Passes every call to `inner` and records where a decision left GPUs idle while a model
    waited to run, and where a start on waiting models launched nothing."""

    def __init__(self, inner: Policy):
        self.inner, self.name, self.hops = inner, inner.name, inner.hops
        self.idle_while_waiting: list[str] = []
        self.started_nothing = False

    def start(self, view: ClusterView) -> Decision:
        decision = self.inner.start(view)
        self.started_nothing = bool(view.waiting()) and not decision.launch
        self._check(view, decision)
        return decision

    def on_event(self, event, view: ClusterView) -> Decision:
        decision = self.inner.on_event(event, view)
        self._check(view, decision)
        return decision

    def _check(self, view: ClusterView, decision: Decision) -> None:
        if decision.checkpoint or decision.end_round:
            return  # GPUs about to change hands
        launched = {m.model: m.gpus for plan in decision.launch for m in plan.members}
        free = set(view.free_gpus) - {g for gpus in launched.values() for g in gpus}
        waiting = [m for m in view.waiting() if m not in launched]
        resizing = view.ids_in(ModelState.CHECKPOINTING)  # fleet-adaptive keeps GPUs for them
        if free and waiting and not resizing:
            self.idle_while_waiting.append(f"t={view.time:.1f}: GPUs {sorted(free)} idle, {waiting} waiting")


def random_table(rng: np.random.Generator, models: int, gpn: int) -> RateTable:
    profiles = []
    for k in range(models):
        r1, eff = rng.uniform(5, 100), rng.uniform(0.6, 1.0)
        rates = tuple(r1 * m * eff ** (m - 1) for m in range(1, 2 * gpn + 1))
        profiles.append(ModelProfile(f"m{k}", rates, param_bytes=10**6))
    return RateTable(tuple(profiles), gpn, 100)


def random_scenario(seed: int) -> Scenario:
    rng = np.random.default_rng(seed)
    gpn = int(rng.integers(1, 5))
    models = int(rng.integers(2, 12))
    rates = random_table(rng, models, gpn)
    epochs = tuple(int(e) for e in rng.integers(1, 8, size=models))
    estimates = tuple(float(e * rng.uniform(0.7, 1.3)) for e in epochs)
    return Scenario(rates, epochs, estimates, Cluster(int(rng.integers(1, 3 * gpn + 1)), gpn))


def run_with_interrupts(policy: str, scenario: Scenario, rng: np.random.Generator, costs: Overheads,
                        max_runs: int = 12) -> tuple[dict[str, float], list[Watched]]:
    """Interrupt at a random point of each run (the last one runs to the end); returns the
    epochs each model trained over all runs and the watched policy of each run."""
    trained: dict[str, float] = {}
    watched_runs = []
    runs = 0
    while scenario is not None:
        runs += 1
        whole = simulate(create_policy(policy, seed=runs), scenario, costs)
        interrupt = None if runs == max_runs else float(rng.uniform(0, 1.1 * whole.makespan))
        watched = Watched(create_policy(policy, seed=runs))
        result = simulate(watched, scenario, costs, interrupt_at=interrupt)
        watched_runs.append(watched)
        for profile, done in zip(scenario.rates.models, result.epochs_trained):
            trained[profile.id] = done
        scenario = resumed_scenario(scenario, result)
        assert result.interrupted == (scenario is not None)
    return trained, watched_runs


@pytest.mark.parametrize("policy", sorted(POLICIES))
@pytest.mark.parametrize("seed", range(12))
def test_every_policy_resumes_any_number_of_times(policy, seed):
    scenario = random_scenario(seed)
    trained, runs = run_with_interrupts(policy, scenario, np.random.default_rng([seed, 1]), Overheads(latency_s=1.0))
    for profile, epochs in zip(scenario.rates.models, scenario.true_epochs):
        assert trained[profile.id] == pytest.approx(epochs), "an epoch was lost or trained twice"
    assert not any(w.started_nothing for w in runs), "a resumed run started nothing while models waited"
    if policy in WORK_CONSERVING:
        idle = [line for w in runs for line in w.idle_while_waiting]
        assert not idle, idle[:3]


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_resume_on_a_paper_workload_after_several_signals(policy):
    workload = paper100(seed=4, models=24)
    scenario = workload.scenario(16)
    trained, runs = run_with_interrupts(policy, scenario, np.random.default_rng(9), Overheads(), max_runs=6)
    assert trained == pytest.approx(dict(zip(workload.rates.ids, map(float, workload.true_epochs))))
    assert len(runs) == 6
    if policy in WORK_CONSERVING:
        assert not [line for w in runs for line in w.idle_while_waiting]


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_a_run_resumed_with_only_partly_trained_models_runs_them(policy):
    """The requeued job that stalled: every model waiting is PAUSED mid-training, none is
    PENDING. Every policy must start them (fleet-l and fleet-adaptive launched only PENDING
    models and stalled)."""
    rng = np.random.default_rng(3)
    rates = random_table(rng, 9, 4)
    epochs = (400,) * 9
    scenario = Scenario(rates, epochs, tuple(map(float, epochs)), Cluster(4, 4),
                        resumed=tuple(float(e) for e in rng.uniform(5, 300, size=9)))
    watched = Watched(create_policy(policy, seed=0))
    result = simulate(watched, scenario, Overheads(latency_s=1.0))
    assert not watched.started_nothing
    assert result.epochs_trained == pytest.approx([400.0] * 9)
    if policy in WORK_CONSERVING:
        assert not watched.idle_while_waiting, watched.idle_while_waiting[:3]


def test_an_interrupt_checkpoints_every_running_model_and_starts_nothing_more():
    rates = RateTable(tuple(ModelProfile(f"m{k}", (10.0,)) for k in range(3)), 1, 100)
    scenario = Scenario(rates, (2, 2, 2), (2.0, 2.0, 2.0), Cluster(2, 1))
    result = simulate(create_policy("baseline", seed=0), scenario, FREE, interrupt_at=15.0)
    assert result.interrupted and result.makespan == pytest.approx(15.0)
    assert sorted(result.epochs_trained) == pytest.approx([0.0, 1.5, 1.5])
    nxt = resumed_scenario(scenario, result)
    assert [d is None for d in nxt.resumed].count(True) == 1  # the one never launched is PENDING
    assert sorted(d for d in nxt.resumed if d is not None) == pytest.approx([1.5, 1.5])
    again = simulate(create_policy("baseline", seed=0), nxt, FREE)
    # two resume (0.5 epochs = 5 s) and one starts fresh (20 s) on the two GPUs: 5 + 20
    assert not again.interrupted and again.makespan == pytest.approx(25.0)


def test_resumed_progress_must_be_less_than_the_true_epochs():
    rates = RateTable((ModelProfile("m", (10.0,)),), 1, 100)
    with pytest.raises(ValueError, match="resumed"):
        Scenario(rates, (2,), (2.0,), Cluster(1, 1), resumed=(2.0,))
    assert math.isclose(Scenario(rates, (2,), (2.0,), Cluster(1, 1), resumed=(1.9,)).resumed[0], 1.9)
