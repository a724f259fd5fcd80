"""Bundles planned as units (issue 49): `fleet.schedule.bundling` with the one driver and a
fake world, no processes.

Every policy that puts one-trainer members on streams plans a bundle as one unit on one GPU;
the books stay per model: a model that converges leaves the bundle without freeing its GPU,
the last one frees it, a checkpoint of the unit checkpoints its running models, and early
stopping holds, promotes and stops models of a bundle one by one.
"""

from dataclasses import dataclass, field

import pytest

from fleet.schedule import Decision, Member, ModelState, PolicyError, RateTable, StreamPlan, create_policy
from fleet.schedule.bundling import Bundled, bundle_rate, form_bundles, unit_id, unit_state
from fleet.schedule.driver import Driver
from fleet.schedule.early_stop import EarlyStopSettings, create_early_stopping
from fleet.schedule.ledger import Ledger

BUNDLING_POLICIES = ("fleet-g", "fleet-l", "fleet-adaptive", "homogeneous", "baseline")


def table(rates: dict[str, float]) -> RateTable:
    return RateTable.from_dict({"gpus_per_node": 1, "samples_per_epoch": 1000,
                                "models": [{"id": m, "rates": {"1": r}} for m, r in rates.items()]})


@dataclass
class World:
    """Records what the driver asks; says what time it is."""

    clock: float = 0.0
    launched: list = field(default_factory=list)  # (stream, members, join) of each launch
    checkpointed: list = field(default_factory=list)
    stopped: list = field(default_factory=list)
    passed: list = field(default_factory=list)

    def now(self) -> float:
        self.clock += 1.0
        return self.clock

    def round_ending(self, index: int) -> None:
        pass

    def checkpoint(self, model: str) -> None:
        self.checkpointed.append(model)

    def launch(self, launches, new_round: bool, planning_s: float) -> None:
        self.launched.extend((launch.stream, launch.members, launch.join) for launch in launches)

    def record_rungs(self, decisions) -> None:
        pass

    def stop(self, model: str) -> None:
        self.stopped.append(model)

    def rung_passed(self, model: str) -> None:
        self.passed.append(model)


def bundled_driver(policy: str, rates: dict[str, float], bundles, gpus: int = 1, epochs: float = 2.0,
                   early: EarlyStopSettings | None = None) -> tuple[Driver, World]:
    rate_table = table(rates)
    ledger = Ledger(rate_table, [epochs] * len(rates), gpus, 1)
    world = World()
    stopping = create_early_stopping(early, rate_table.ids) if early else None
    return Driver(Bundled(create_policy(policy), bundles), ledger, world, early=stopping), world


# -- forming bundles ---------------------------------------------------------------------------


def test_a_group_takes_its_share_of_the_slots_and_at_most_eight_models_a_bundle():
    four = ["a", "b", "c", "d"]
    assert form_bundles([four], 4, 1) == [("a", "b", "c", "d")]
    assert form_bundles([four], 4, 4) == []  # a slot each: nothing to fuse
    assert form_bundles([four], 4, 2) == [("a", "b"), ("c", "d")]
    # 4 fusable models among 104 on 4 slots: their share is one slot
    assert form_bundles([four], 104, 4) == [("a", "b", "c", "d")]
    sweep = [f"m{i:02d}" for i in range(32)]
    assert [len(b) for b in form_bundles([sweep], 32, 1)] == [8, 8, 8, 8]
    assert [len(b) for b in form_bundles([sweep[:11]], 11, 1)] == [6, 5]
    assert form_bundles([["x"], ["y", "z"]], 3, 1) == [("y", "z")]


def test_a_unit_is_a_bundle_s_models_at_the_sum_of_their_step_times():
    rates = table({"a": 100.0, "b": 300.0, "c": 50.0})
    assert bundle_rate(rates, ["a", "b"]) == pytest.approx(75.0)
    assert unit_id(["a", "b"]) == "a+b"
    running, paused, held = ModelState.RUNNING, ModelState.PAUSED, ModelState.HELD
    assert unit_state([ModelState.CONVERGED, running, paused]) is running
    assert unit_state([ModelState.CONVERGED, held, paused]) is paused
    assert unit_state([ModelState.CONVERGED, held]) is held
    assert unit_state([ModelState.CONVERGED] * 2) is ModelState.CONVERGED


# -- one bundle on one GPU, under every policy that bundles -------------------------------------


@pytest.mark.parametrize("policy", BUNDLING_POLICIES)
def test_four_models_train_as_one_bundle_on_one_gpu_and_free_it_with_the_last(policy):
    models = {m: 100.0 for m in "abcd"}
    driver, world = bundled_driver(policy, models, [("a", "b", "c", "d")])
    driver.start()
    assert len(world.launched) == 1
    (_, members, _), = world.launched
    assert members == (Member("a", (0,), ("a", "b", "c", "d")),)
    ledger = driver.ledger
    assert all(ledger.model(m).gpus == (0,) for m in models) and ledger.free_gpus == ()
    for m in models:
        driver.epoch_completed(m, 1, 25.0) if m != "d" else driver.converged("d", 1, 25.0)
    assert ledger.model("d").state is ModelState.CONVERGED and ledger.free_gpus == ()
    for m in "abc":
        driver.converged(m, 2, 33.0)
    assert driver.finished and ledger.free_gpus == (0,)
    assert len(world.launched) == 1


@pytest.mark.parametrize("policy", BUNDLING_POLICIES)
def test_a_bundle_and_a_model_alone_share_two_gpus(policy):
    rates = {"a": 100.0, "b": 100.0, "c": 100.0, "x": 34.0}  # the bundle's rate: 33.3, matched with x's
    driver, world = bundled_driver(policy, rates, [("a", "b", "c")], gpus=2)
    driver.start()
    members = [m for _, launch, _ in world.launched for m in launch]
    assert sorted(m.ids for m in members) == [("a", "b", "c"), ("x",)]
    assert sorted(g for m in members for g in m.gpus) == [0, 1]
    for m in "abcx":
        driver.converged(m, 2, 50.0)
    assert driver.finished


def test_a_bundle_checkpointed_at_a_round_s_end_is_launched_again_with_its_models_left():
    """fleet-g ends its round when the lone model converges (1 of 2 GPUs busy < 0.8 x 2): the
    bundle's running models are checkpointed, and the next round starts them again as one."""
    rates = {"a": 100.0, "b": 100.0, "c": 100.0, "x": 34.0}
    driver, world = bundled_driver("fleet-g", rates, [("a", "b", "c")], gpus=2)
    driver.start()
    (_, first, _), = world.launched  # one flotilla: the bundle (at 33.3 samples/s) and x
    assert sorted(m.ids for m in first) == [("a", "b", "c"), ("x",)]
    driver.converged("c", 1, 40.0)  # c leaves the bundle: nothing planned
    assert world.checkpointed == [] and len(world.launched) == 1
    driver.converged("x", 2, 34.0)
    assert sorted(world.checkpointed) == ["a", "b"]
    driver.checkpointed("a", 1)
    assert len(world.launched) == 1  # b still holds the bundle's GPU
    driver.checkpointed("b", 1)
    *_, (_, members, _) = world.launched
    assert members == (Member("a", members[0].gpus, ("a", "b")),)


def test_a_policy_giving_a_bundle_two_gpus_is_an_error():
    class Wide(type(create_policy("fleet-g"))):
        def start(self, view):
            return Decision.launching([StreamPlan((Member(view.waiting()[0], (0, 1)),))])

    driver = Driver(Bundled(Wide(), [("a", "b")]), Ledger(table({"a": 1.0, "b": 1.0}), [1, 1], 2, 1), World())
    with pytest.raises(PolicyError, match="bundle a\\+b planned on 2 GPUs"):
        driver.start()


# -- early stopping, model by model ---------------------------------------------------------------


@pytest.mark.parametrize("policy", BUNDLING_POLICIES)
def test_successive_halving_holds_promotes_and_stops_the_models_of_a_bundle_one_by_one(policy):
    """sha at rung 1: each model of the bundle is held there (checkpointed out of it) until the
    last one's report fills the rung, which stops it and c there; the last to leave frees the
    GPU, and the best half, promoted, is launched again as one bundle."""
    early = EarlyStopSettings("sha", 2, min_epochs=1, reduction=2)
    driver, world = bundled_driver(policy, {m: 100.0 for m in "abcd"}, [("a", "b", "c", "d")], early=early)
    driver.start()
    for metric, m in enumerate("abcd"):
        driver.epoch_completed(m, 1, 25.0, metric=float(metric))
    assert world.checkpointed == ["a", "b", "c"] and world.stopped == ["d"]
    driver.stopped("d", 1, 25.0)
    for m in "ab":
        driver.checkpointed(m, 1)
        assert driver.ledger.free_gpus == () and len(world.launched) == 1
    driver.checkpointed("c", 1)
    ledger = driver.ledger
    assert {m: ledger.model(m).state for m in "abcd"} == {
        "a": ModelState.RUNNING, "b": ModelState.RUNNING, "c": ModelState.CONVERGED, "d": ModelState.CONVERGED}
    *_, (_, members, _) = world.launched
    assert members == (Member("a", (0,), ("a", "b")),)
    driver.converged("a", 2, 50.0)
    driver.converged("b", 2, 50.0)
    assert driver.finished


@pytest.mark.parametrize("policy", BUNDLING_POLICIES)
def test_asha_stops_a_model_of_a_bundle_while_the_others_train_on(policy):
    early = EarlyStopSettings("asha", 2, min_epochs=1, reduction=2)
    driver, world = bundled_driver(policy, {m: 100.0 for m in "abcd"}, [("a", "b", "c", "d")], early=early)
    driver.start()
    for metric, m in enumerate("abcd"):
        driver.epoch_completed(m, 1, 25.0, metric=float(metric))
    assert world.stopped and world.checkpointed == []
    for m in world.stopped:
        driver.stopped(m, 1, 25.0)
    assert driver.ledger.free_gpus == ()
    for m in sorted(set("abcd") - set(world.stopped)):
        driver.converged(m, 2, 40.0)
    assert driver.finished and len(world.launched) == 1


def test_a_model_that_left_its_running_bundle_waits_for_the_bundle_s_next_launch():
    """A model checkpointed out of its bundle while the rest trains (as early stopping holds
    one, later promoted) does not join it there: the unit stays running; when its last running
    model converges, the unit is launched again for the model that waits."""
    driver, world = bundled_driver("homogeneous", {m: 100.0 for m in "abc"}, [("a", "b", "c")])
    driver.start()
    driver.ledger.start_checkpoint("c")  # what the driver does to a model held at a rung
    driver.checkpointed("c", 1)
    assert driver.ledger.model("c").state is ModelState.PAUSED
    driver.converged("a", 2, 50.0)
    assert len(world.launched) == 1
    driver.converged("b", 2, 50.0)
    assert len(world.launched) == 2
    *_, (_, members, _) = world.launched
    assert members == (Member("c", (0,)),)
    driver.converged("c", 2, 100.0)
    assert driver.finished
