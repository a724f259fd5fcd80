"""The one driver of the policy protocol, with a fake world and no processes.

The simulator and the runtime's coordinator are both worlds of `fleet.schedule.driver.Driver`.
Here a fake world replays the events a simulated run delivered, at the same times, and every
policy must make the same decisions as it made in the simulator: what a policy decides depends
on the events and the driver's books, not on which world runs it. The protocol errors that
used to differ between the two drivers are checked once, here, on the driver.
"""

from dataclasses import dataclass, field

import pytest

from fleet.schedule import (
    END_ROUND,
    NO_DECISION,
    POLICIES,
    Cluster,
    ClusterView,
    Decision,
    EpochCompleted,
    Member,
    ModelConverged,
    ModelProfile,
    ModelState,
    Overheads,
    Policy,
    PolicyError,
    RateTable,
    Scenario,
    StreamPlan,
    create_policy,
    paper100,
    simulate,
)
from fleet.schedule.driver import Driver, Launch
from fleet.schedule.ledger import Ledger, describe_books


class Recorded(Policy):
    """Passes every call to `inner`; records (event, epochs of its model, decision)."""

    def __init__(self, inner: Policy):
        self.inner, self.name, self.hops = inner, inner.name, inner.hops
        self.calls: list[tuple] = []

    def start(self, view: ClusterView) -> Decision:
        decision = self.inner.start(view)
        self.calls.append((None, None, decision))
        return decision

    def on_event(self, event, view: ClusterView) -> Decision:
        decision = self.inner.on_event(event, view)
        model = getattr(event, "model", None)
        self.calls.append((event, view.model(model).epochs_done, decision))
        return decision


@dataclass
class ReplayWorld:
    """A world with no physics: it says what time the script says and records what it is told."""

    clock: float = 0.0
    told: list[tuple] = field(default_factory=list)

    def now(self) -> float:
        return self.clock

    def round_ending(self, index: int) -> None:
        self.told.append(("round_ending", index))

    def checkpoint(self, model: str) -> None:
        self.told.append(("checkpoint", model))

    def launch(self, launches, new_round: bool, planning_s: float) -> None:
        self.told.append(("launch", tuple(launches), new_round))


def replay(driver: Driver, world: ReplayWorld, script: list[tuple]) -> None:
    """Feed `driver` the (event, epochs) pairs a simulated run's policy saw, in order. A
    hopping policy saw no event for a visit that did not end an epoch: its checkpoint's
    event says it ended (the model still runs in the books then)."""
    driver.start()
    ledger = driver.ledger
    hopping = driver.policy.hops

    def end_visit(model: str, epochs: int, rate: float) -> None:
        visited = ledger.partitions.of_gpu(ledger.model(model).gpus[0])
        driver.visit_completed(model, visited, epochs, rate)

    for event, epochs, _ in script:
        world.clock = event.time
        if isinstance(event, EpochCompleted):
            if hopping:
                end_visit(event.model, event.epoch, event.samples_per_s)
            else:
                driver.epoch_completed(event.model, event.epoch, event.samples_per_s)
        elif isinstance(event, ModelConverged):
            driver.converged(event.model, event.epochs, event.samples_per_s)
        else:
            if hopping and ledger.model(event.model).state is ModelState.RUNNING:
                end_visit(event.model, epochs, 0.0)
            driver.checkpointed(event.model, epochs)


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_every_policy_decides_the_same_in_a_fake_world_as_in_the_simulator(policy):
    workload = paper100(seed=2, models=16)
    scenario = workload.scenario(8)
    simulated = Recorded(create_policy(policy, seed=3))
    result = simulate(simulated, scenario, Overheads(planning_s=0.0))
    assert result.rounds >= 1 and len(simulated.calls) > len(scenario.true_epochs)

    replayed = Recorded(create_policy(policy, seed=3))
    world = ReplayWorld()
    ledger = Ledger(workload.rates, scenario.epochs_estimate, 8, workload.rates.gpus_per_node)
    replay(Driver(replayed, ledger, world), world, simulated.calls[1:])
    assert [d for _, _, d in replayed.calls] == [d for _, _, d in simulated.calls]
    assert ledger.round + 1 == result.rounds
    launched = [m.model for kind, *rest in world.told if kind == "launch" for launch in rest[0] for m in launch.members]
    assert len(launched) == len(result.timeline.members)


# ------------------------------------------------------------------ one set of errors

TWO = RateTable((ModelProfile("a", (10.0, 18.0)), ModelProfile("b", (10.0, 18.0))), 2, 100)


class Scripted(Policy):
    """Answers `start` with `first`, every event with NO_DECISION."""

    name = "scripted"

    def __init__(self, first):
        self.first = first

    def start(self, view: ClusterView):
        return self.first


def driver_for(policy: Policy) -> tuple[Driver, ReplayWorld]:
    world = ReplayWorld()
    return Driver(policy, Ledger(TWO, [1.0, 1.0], 2, 2), world), world


LAUNCH_A = Decision(launch=(StreamPlan((Member("a", (0,)),)),))


@pytest.mark.parametrize("first, message", [
    (Decision(launch=LAUNCH_A.launch, end_round=True), "end_round cannot be combined"),
    (Decision(checkpoint=("a",), end_round=True), "end_round cannot be combined"),
    ("launch a", "not a Decision"),
    (NO_DECISION, "stalled with 2 models left"),
    (Decision(checkpoint=("a",)), "cannot checkpoint a, it is pending"),
    (Decision(launch=(StreamPlan((Member("a", (0,)), Member("b", (0,)))),)), "GPU 0 for b is not free"),
    (Decision(launch=(StreamPlan((Member("a", (0,)),), join=7),)), "stream 7 is not running"),
])
def test_every_protocol_violation_is_a_policy_error(first, message):
    driver, world = driver_for(Scripted(first))
    with pytest.raises(PolicyError, match=message):
        driver.start()
    assert world.told == []  # nothing of a refused decision was carried out


def test_a_stall_after_the_last_checkpoint_is_a_policy_error():
    driver, world = driver_for(Scripted(LAUNCH_A))
    driver.start()
    assert world.told == [("launch", (Launch(0, (Member("a", (0,)),), False),), True)]
    with pytest.raises(PolicyError, match="scripted: stalled with 2 models left"):
        driver.ledger.start_checkpoint("a")
        driver.checkpointed("a", 0)


class EndsRounds(Policy):
    """Launches a, ends the round at its first epoch, then launches both."""

    name = "ends-rounds"

    def start(self, view):
        return LAUNCH_A

    def on_epoch(self, event, view):
        return END_ROUND

    def on_checkpointed(self, event, view):
        return Decision(launch=(StreamPlan((Member("a", (0,)), Member("b", (1,)))),))


def test_the_driver_counts_rounds_and_reports_a_model_that_converges_while_it_is_checkpointed():
    driver, world = driver_for(EndsRounds())
    driver.start()
    driver.epoch_completed("a", 1, 10.0)
    assert world.told[-2:] == [("round_ending", 0), ("checkpoint", "a")]
    driver.checkpointed("a", 1)
    assert driver.ledger.round == 1 and world.told[-1][2] is True  # a launch on a drained cluster
    view = driver.view()
    assert view.streams[0].pace == 10.0  # planned from the launch on, in every world
    driver.ledger.start_checkpoint("a")  # the world reports a converging while it saves:
    driver.converged("a", 1, 10.0)
    assert driver.ledger.model("a").state.value == "converged" and driver.ledger.unfinished == 1


def test_the_simulator_shows_a_stream_s_planned_pace_before_it_starts():
    """The pace of a launched stream whose member has not started yet is its planned pace in
    the simulator too (it was 0 there, and the planned pace in the runtime, so fleet-adaptive,
    which joins only streams with a pace, could decide differently in the two)."""
    seen = []

    class Watch(Policy):
        name = "watch"

        def start(self, view):
            return LAUNCH_A

        def on_epoch(self, event, view):  # a's first epoch, at 15 + 10: b starts 15 s later
            return Decision(launch=(StreamPlan((Member("b", (1,)),)),))

        def on_converged(self, event, view):
            seen.append((event.model, event.time, view.streams))
            return NO_DECISION

    scenario = Scenario(TWO, (2, 1), (2.0, 1.0), Cluster(2, 2))
    simulate(Watch(), scenario, Overheads(planning_s=0.0, latency_s=0.0, bandwidth=float("inf"), start_s=15.0))
    model, when, streams = seen[0]
    assert (model, when) == ("a", 35.0)  # b launched at 25, starts at 40
    assert [(s.members, s.pace) for s in streams] == [(("b",), 10.0)]


class LaunchesBoth(Policy):
    """Starts a and b on their own GPUs; counts its calls."""

    name = "launches-both"

    def __init__(self):
        self.calls = 0

    def start(self, view):
        self.calls += 1
        return Decision(launch=tuple(StreamPlan((Member(m, (k,)),)) for k, m in enumerate(view.waiting())))

    def on_event(self, event, view):
        self.calls += 1
        return NO_DECISION


def test_a_switched_run_is_checkpointed_and_started_again_by_the_new_policy_only():
    first, second = LaunchesBoth(), LaunchesBoth()
    driver, world = driver_for(first)
    driver.start()
    assert driver.switch_policy(second) == ["a", "b"]
    assert world.told[-3:] == [("round_ending", 0), ("checkpoint", "a"), ("checkpoint", "b")]
    driver.checkpointed("a", 1)  # b still saves: nobody plans yet
    assert (first.calls, second.calls, driver.name) == (1, 0, "launches-both")
    driver.converged("b", 2, 10.0)  # its last epoch ended as it saved
    assert (first.calls, second.calls) == (1, 1) and driver.policy is second
    assert world.told[-1] == ("launch", (Launch(2, (Member("a", (0,)),), False),), True)  # a resumes
    assert driver.ledger.round == 1


def test_a_switch_waits_for_the_models_still_checkpointing():
    old, new = LaunchesBoth(), LaunchesBoth()
    driver, world = driver_for(old)
    driver.start()
    for model in ("a", "b"):
        driver.ledger.start_checkpoint(model)  # the old policy's checkpoints, under way
    driver.checkpointed("a", 0)
    driver.switch_policy(new)
    assert new.calls == 0 and ("round_ending", 0) not in world.told  # nothing ran: no round to end
    driver.checkpointed("b", 0)
    assert (old.calls, new.calls) == (2, 1) and len(world.told[-1][1]) == 2  # both resumed by the new one


# ------------------------------------------------------------------ a restream, then a switch

TEN = RateTable.from_dict({"schema": 1, "gpus_per_node": 4, "samples_per_epoch": 1000, "models": [
    {"id": f"m{k}", "rates": {"1": 100.0 + k, "2": 180.0 + k, "3": 250.0 + k, "4": 310.0 + k}} for k in range(10)]})


class SwitchAt:
    """A fake adapter: hands the run to fleet-g at the `at`-th convergence (the runtime's
    adapter decides so on measured rates)."""

    def __init__(self, at: int):
        self.at, self.seen = at, 0

    def observe(self, model: str, gpus: int, samples_per_s: float) -> None:
        pass

    def part(self, models) -> None:
        pass

    def before_policy(self, event, driver: Driver) -> None:
        if isinstance(event, ModelConverged):
            self.seen += 1
            if self.seen == self.at:
                driver.switch_policy(create_policy("fleet-g"))


def run_restreamed(driver: Driver) -> None:
    """Run `driver` to its end, moving its first two running models to a stream of their own
    as the coordinator does with joins it cannot make (`Membership._restream`); every model
    trains one epoch, the running ones end in turn."""
    driver.start()
    ledger = driver.ledger
    stream = ledger.open_stream()
    for model in ledger.ids_in(ModelState.RUNNING)[:2]:
        ledger.move(model, stream)
    while not driver.finished:
        saving, running = ledger.ids_in(ModelState.CHECKPOINTING), ledger.ids_in(ModelState.RUNNING)
        assert saving or running, describe_books(ledger)  # else the driver would have said it stalled
        if saving:
            driver.checkpointed(saving[0], 0)
        else:
            driver.converged(running[0], 1, 100.0)


def test_models_moved_to_a_stream_of_their_own_free_their_gpus_for_the_policy_handed_over_to():
    """The hang of a `policy: auto` search (tpe + asha): the coordinator moved two joins to a
    stream of their own, they ended, auto handed over to fleet-g, and fleet-g, which plans only
    on a drained cluster, waited forever: the move had counted the two GPUs held twice."""
    world = ReplayWorld()
    driver = Driver(create_policy("fleet-adaptive"), Ledger(TEN, [1.0] * 10, 4, 4), world, SwitchAt(3))
    run_restreamed(driver)
    assert driver.name == "fleet-g" and driver.ledger.unfinished == 0 and driver.ledger.drained
    assert any(told[0] == "launch" and told[2] for told in world.told[1:])  # fleet-g's rounds start drained


def test_a_gpu_held_by_no_model_does_not_hide_a_stall(monkeypatch):
    """Were the books to keep a GPU for no model again (here the old double-counting move),
    the run fails at the policy call that launched nothing, naming the policy, the models left
    and the books, instead of waiting for a report that never comes."""

    moved = Ledger.move

    def double_counting_move(ledger: Ledger, model: str, stream: int) -> None:
        moved(ledger, model, stream)
        for gpu in ledger.model(model).gpus:
            ledger.holders[gpu] += 1  # the old move reserved them again

    monkeypatch.setattr(Ledger, "move", double_counting_move)
    driver = Driver(create_policy("fleet-adaptive"), Ledger(TEN, [1.0] * 10, 4, 4), ReplayWorld(), SwitchAt(3))
    with pytest.raises(PolicyError, match=r"^fleet-g: stalled with \d+ models left \(m\d.*\): nothing runs or "
                                          r"checkpoints and it launched nothing; the books: \d+ waiting, .*"
                                          r"GPUs? [\d, ]+ held by no model\)$"):
        run_restreamed(driver)


def test_a_stall_names_the_first_models_left_and_counts_the_rest():
    driver = Driver(Scripted(NO_DECISION), Ledger(TEN, [1.0] * 10, 4, 4), ReplayWorld())
    with pytest.raises(PolicyError) as stalled:
        driver.start()
    assert str(stalled.value) == (
        "scripted: stalled with 10 models left (m0, m1, m2, m3, m4, m5, m6, m7 and 2 more): nothing runs or "
        "checkpoints and it launched nothing; the books: 10 waiting, 0 held at a rung, 0 running, 0 checkpointing, "
        "0 converged; 0 of 4 GPUs in use")
