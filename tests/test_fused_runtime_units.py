"""Fused bundles in the runtime without processes (issue 49): `runtime.fuse` in the spec, which
bundles a job forms and why models are left apart, a bundle master's commands, and a bundle's
place in its stream's books."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from fleet.engines.bundle import SequentialBundle, create_bundle
from fleet.engines.emulated import EmulatedEngine
from fleet.engines.options import EngineOptions
from fleet.engines.torch import TorchEngine
from fleet.engines.torch.fused import FusedTorchEngine
from fleet.runtime.control.fusing import BundleWays, Fusion, decided_rates, plan_fusion, recorded_decisions
from fleet.runtime.events import EventLog
from fleet.runtime.protocol import BundleDecided, CheckpointModel, KeepAlive, RungVerdict, StartBundle, StartMember
from fleet.runtime.train.bundle_steps import BundleSteps
from fleet.runtime.train.coordinator_link import CoordinatorLink
from fleet.schedule import Member, RateTable
from fleet.schedule.bundle_ways import TRIAL_STEPS, TRIAL_WARMUP, Way, WayDecision
from fleet.schedule.bundling import UnitBooks
from fleet.schedule.ledger import Ledger
from fleet.spec import Fuse, SpecError, parse_spec
from test_fused_engine import batches, member, options
from test_runtime_control_units import RecordedMembership, RecordingLog, rates4

CNN = {"family": "cnn", "params": {"channels": [8], "hidden": 16}}


def spec_of(models: list[dict], fuse: str = "always", device: str = "cpu", **data):
    return parse_spec({"name": "f", "data": {"source": "digits", **data}, "models": models,
                       "cluster": {"device": device}, "runtime": {"fuse": fuse}}, check_paths=False)


def cnns(*names: str, **train) -> list[dict]:
    return [{**CNN, "name": n, "train": {"lr": 0.01 * (k + 1), **train}} for k, n in enumerate(names)]


# -- the spec ------------------------------------------------------------------------------------


def test_runtime_fuse_is_auto_measure_always_or_never():
    assert spec_of(cnns("a"), fuse="auto").runtime.fuse is Fuse.AUTO
    assert spec_of(cnns("a"), fuse="measure").runtime.fuse.measures and not Fuse.ALWAYS.measures
    assert parse_spec({"name": "f", "data": {"source": "digits"}, "models": cnns("a")}).runtime.fuse is Fuse.AUTO
    with pytest.raises(SpecError, match="runtime.fuse: Input should be 'auto', 'measure', 'always' or 'never'"):
        spec_of(cnns("a"), fuse="yes")


def test_fuse_always_where_no_bundle_is_built_is_one_line():
    data = {"source": "hdf5", "path": "/x.h5", "group_by": {"dataset": "groups"}}
    with pytest.raises(SpecError, match=r"^runtime.fuse: always: bundles are not built for learning over groups"):
        parse_spec({"name": "f", "data": data, "models": cnns("a"), "runtime": {"fuse": "always"}}, check_paths=False)
    assert parse_spec({"name": "f", "data": data, "models": cnns("a"), "runtime": {"fuse": "auto"}},
                      check_paths=False).runtime.fuse is Fuse.AUTO


# -- which bundles a job forms ---------------------------------------------------------------------


def test_measure_forms_bundles_on_any_real_device_auto_on_cuda_only_and_each_is_timed_first():
    models = cnns("a", "b", "c", "d")
    for mode, device in (("measure", "cpu"), ("measure", "cuda"), ("auto", "cuda")):
        timed = plan_fusion(spec_of(models, mode, device), list("abcd"), {}, 1)
        assert timed.bundles == (("a", "b", "c", "d"),) and timed.decided == ()
        assert timed.note == (f"runtime.fuse {mode}: 1 bundle(s) of 4 models on one {device} trainer each, each timed "
                              "fused against its models one by one in its first steps, the faster kept; 0 model(s) apart")
    on_cpu = plan_fusion(spec_of(models, "auto", "cpu"), list("abcd"), {}, 1)
    assert on_cpu.bundles == () and "runtime.fuse auto: no bundles on cpu trainers" in on_cpu.note
    assert "runtime.fuse: measure times both ways" in on_cpu.note
    emulated = plan_fusion(spec_of(models, "auto", "emulated"), list("abcd"), {}, 1)
    assert emulated.bundles == () and "no bundles on emulated trainers" in emulated.note
    assert plan_fusion(spec_of(models, "always", "emulated"), list("abcd"), {}, 1).bundles == (("a", "b", "c", "d"),)
    assert plan_fusion(spec_of(models, "never", "cuda"), list("abcd"), {}, 1) == Fusion()
    alone = [*cnns("a"), {"family": "lstm", "name": "l"}]
    assert plan_fusion(spec_of(alone, "auto"), ["a", "l"], {}, 1) == Fusion()  # nothing to fuse: no line
    assert plan_fusion(spec_of(alone), ["a", "l"], {}, 1).note == "runtime.fuse always: no two models left may fuse"
    always = plan_fusion(spec_of(models), list("abcd"), {}, 1)
    assert always.bundles == (("a", "b", "c", "d"),) and always.refused == ()
    assert always.lines() == ["runtime.fuse always: 1 bundle(s) of 4 models on one cpu trainer each, each trained "
                              "as one fused model; 0 model(s) apart"]


def test_models_left_apart_are_named_with_the_reason():
    models = [*cnns("a", "b"), {**CNN, "name": "w", "params": {"channels": [16], "hidden": 16}},
              {"family": "lstm", "name": "l"}, *cnns("x", "y", optimizer="adam"), {"family": "mlp", "name": "m"}]
    fusion = plan_fusion(spec_of(models), ["a", "b", "w", "l", "x", "y", "m"], {}, 2)
    assert fusion.bundles == (("a", "b"), ("x", "y"))
    reasons = dict(fusion.refused)
    assert "differ in params: channels" in reasons[("w",)]
    assert "no batching rule for aten::lstm" in reasons[("l",)]
    assert reasons[("m",)] == "no other model left is a mlp of its params, optimizer and batch size"


def test_models_at_different_positions_in_their_epochs_bundle_apart():
    fusion = plan_fusion(spec_of(cnns("a", "b", "c", "d", "e")), list("abcde"), {"a": 96, "b": 96, "c": 0, "e": 32}, 1)
    assert fusion.bundles == (("a", "b"), ("c", "d"))
    assert [(models, reason.split(" (")[0]) for models, reason in fusion.refused] == [
        (("e",), "resumed at another position in its epoch than the other models of its architecture")]


def test_a_slot_per_model_forms_no_bundle_and_says_why():
    fusion = plan_fusion(spec_of(cnns("a", "b")), ["a", "b"], {}, 2)
    assert fusion.bundles == () and fusion.refused == ((("a", "b"), "its 2 models of one architecture have a "
                                                        "trainer slot each"),)


# -- how a bundle trains (runtime.fuse: measure) ------------------------------------------------------


def test_recorded_decisions_are_read_back_and_a_resumed_bundle_is_planned_and_started_as_decided(tmp_path):
    spec = spec_of(cnns("a", "b", "c", "d"), "measure")
    log = EventLog(tmp_path / "events.jsonl")
    log.write("run_start", policy="fleet-g")
    log.write("bundle_decided", models=["a", "b", "c", "d"], fused_step_s=0.4, one_by_one_step_s=0.2,
              kept="one_by_one", stream=0)
    log.write("bundle_decided", models=["x"], kept="sideways")  # not a decision: left out
    log.close()
    recorded = recorded_decisions(tmp_path)
    assert recorded == [WayDecision(("a", "b", "c", "d"), 0.4, 0.2, Way.ONE_BY_ONE)]
    fusion = plan_fusion(spec, ["a", "b", "c"], {}, 1, recorded)  # d converged before the requeue
    assert fusion.bundles == (("a", "b", "c"),) and fusion.decided == tuple(recorded)
    assert "1 as an earlier job decided" in fusion.note
    rates = RateTable.from_dict({"gpus_per_node": 1, "samples_per_epoch": 100, "models": [
        {"id": m, "rates": {"1": 1000.0}} for m in "abc"]})
    planned = UnitBooks(fusion.bundles).table(decided_rates(spec, rates, fusion))
    assert planned.rate("a+b+c", 1) == pytest.approx(32 / (0.2 * 3 / 4))  # batch 32 per three quarters of 0.2 s
    ways = BundleWays(spec, fusion.decided, RecordingLog(), RecordingLog())
    assert ways.way(("a", "b", "c")) == "one_by_one" and ways.way(("a", "e")) is None
    assert BundleWays(spec_of(cnns("a", "b")), (), RecordingLog(), RecordingLog()).way(("a", "b")) == "fused"
    assert plan_fusion(spec_of(cnns("a", "b", "c"), "always"), ["a", "b", "c"], {}, 1, recorded).decided == ()


def test_a_decision_is_recorded_said_and_planned_at_its_measured_rate(tmp_path):
    spec = spec_of(cnns("a", "b"), "measure")
    log, console = RecordingLog(), RecordingLog()
    log.sync = lambda: None
    said = []
    console.bundle_decided = lambda *args: said.append(args)
    ways = BundleWays(spec, (), log, console)
    rates = RateTable.from_dict({"gpus_per_node": 1, "samples_per_epoch": 100, "models": [
        {"id": m, "rates": {"1": 100.0}} for m in "ab"]})
    factors = ways.decided(BundleDecided(("a", "b"), 3, 0.08, 0.64, "fused"), rates)
    assert log.events == [("bundle_decided", {"models": ["a", "b"], "fused_step_s": 0.08, "one_by_one_step_s": 0.64,
                                              "kept": "fused", "stream": 3})]
    assert said == [(("a", "b"), 0.08, 0.64, "fused")]
    assert factors == {"a": pytest.approx(8.0), "b": pytest.approx(8.0)}  # 32 per 0.08 s against 50 samples/s
    assert ways.way(("a", "b")) == "fused"


@pytest.mark.parametrize("min_speedup, kept", [(0.0, Way.FUSED), (1e9, Way.ONE_BY_ONE)])
def test_a_bundle_s_trial_keeps_a_way_and_trains_each_model_as_its_own_engine(min_speedup, kept):
    """Each way trains every model on every batch once: after the trial (both ways timed, the
    engine rebuilt from the models' states at each change) and a few steps of the kept way,
    each model's weights, statistics, counters and dropout generator are its own engine's."""
    models = [member("cnn", k) for k in range(3)]
    steps = BundleSteps([options(m) for m in models], {}, None, min_speedup)
    engines = [TorchEngine(options(m)) for m in models]
    decisions, ways = [], []
    for x, y in batches(2 * (TRIAL_WARMUP + TRIAL_STEPS) + 3, family="cnn"):
        losses, decision = steps.step(x, y, whole=True)
        ways.append(steps.way)
        alone = {engine.model_id: engine.train_step(x, y) for engine in engines}
        np.testing.assert_allclose([losses[m] for m in alone], list(alone.values()), rtol=1e-4, atol=1e-5)
        decisions += [decision] if decision is not None else []
    [decision] = decisions
    assert decision.kept is kept and decision.models == tuple(m.id for m in models)
    assert decision.fused_step_s > 0 and decision.one_by_one_step_s > 0
    assert set(ways) == {Way.ONE_BY_ONE, Way.FUSED} and ways[-1] is kept and steps.trial is None
    assert isinstance(steps.engine, FusedTorchEngine if kept is Way.FUSED else SequentialBundle)
    for model, engine in zip(models, engines):
        again = TorchEngine(options(model))
        again.load_state_bytes(steps.engine.member_state_bytes(model.id))
        np.testing.assert_allclose(again.flat_parameters(), engine.flat_parameters(), rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(again.flat_buffers(), engine.flat_buffers(), rtol=1e-4, atol=1e-5)
        assert again.state()["steps"] == engine.state()["steps"] == len(ways)
        assert torch.equal(again.state()["rng"]["generator"], engine.state()["rng"]["generator"])


def test_a_model_leaving_mid_trial_restarts_it_and_the_last_one_ends_it():
    models = [member("mlp", k) for k in range(3)]
    steps = BundleSteps([options(m) for m in models], {}, None)
    data = batches(TRIAL_WARMUP + TRIAL_STEPS + 1)
    for x, y in data:
        steps.step(x, y, whole=True)
    assert steps.trial.way is Way.FUSED
    steps.leave(models[1].id)
    assert steps.trial.models == (models[0].id, models[2].id) and steps.trial.way is Way.ONE_BY_ONE
    steps.step(*data[0], whole=True)  # the engine follows the trial back to one by one
    assert steps.way is Way.ONE_BY_ONE and steps.engine.model_ids == [models[0].id, models[2].id]
    steps.leave(models[0].id)
    assert steps.trial is None and steps.kept is Way.ONE_BY_ONE  # one model: nothing to decide
    assert BundleSteps([options(m) for m in models], {}, "fused").trial is None  # told: no trial


# -- the emulated device's bundle -------------------------------------------------------------------


def test_an_emulated_bundle_steps_as_long_as_its_models_one_after_another():
    spec = spec_of(cnns("a", "b"), device="emulated")
    rates = RateTable.from_dict({"gpus_per_node": 1, "samples_per_epoch": 100, "models": [
        {"id": "a", "rates": {"1": 100.0}}, {"id": "b", "rates": {"1": 300.0}}]})
    options = [EngineOptions(m, (1, 8, 8), 10, device="emulated") for m in spec.models]
    waits = []  # the sleeps, recorded instead of taken
    bundle = SequentialBundle([EmulatedEngine(o, rates, epochs_to_converge=2, sleep=waits.append) for o in options])
    x, y = np.zeros((30, 1, 8, 8), np.float32), np.arange(30) % 10
    assert set(bundle.train_step(x, y)) == {"a", "b"}
    assert sum(waits) == pytest.approx(30 / 100 + 30 / 300)
    state = bundle.member_state_bytes("a")
    bundle.leave("a")
    assert bundle.model_ids == ["b"]
    again = create_bundle(options, {"a": state}, rates=rates, epoch_limits={})
    assert isinstance(again, SequentialBundle) and again.member_state_bytes("a") == state


# -- a bundle master's commands ---------------------------------------------------------------------


class Inbox:
    """A control communicator fake: `improbe` hands out the queued commands one at a time."""

    def __init__(self, *commands):
        self.commands = list(commands)

    def improbe(self, source=None, tag=None):
        if not self.commands:
            return None
        command = self.commands.pop(0)
        return SimpleNamespace(recv=lambda: command)


def test_a_bundle_master_keeps_each_model_s_commands_until_it_asks():
    start = StartMember("z", 9, (1,), None, None, 0, 0, False)
    inbox = Inbox(RungVerdict("b", go_on=True, next_stop=4), CheckpointModel("a", ("a", "c")), KeepAlive(),
                  RungVerdict("x", go_on=False), start)
    ctx = SimpleNamespace(ctrl=inbox, pending=[], timeout_s=5.0)
    link = CoordinatorLink(ctx, "a", ("a", "b", "c"))
    assert link.await_verdict(2, "b") == RungVerdict("b", go_on=True, next_stop=4)
    assert link.poll_commands() is True  # the checkpoint of a and c came meanwhile
    assert link.take_asked() == {"a", "c"} and link.take_asked() == set()
    assert ctx.pending == [start]  # another model's verdict is not theirs; the next start is the loop's
    inbox.commands = [CheckpointModel("b", ("b",))]
    assert link.await_verdict(2, "b") is None  # held at its rung


# -- a bundle in its stream's books ----------------------------------------------------------------


def test_a_bundle_holds_its_stream_until_its_last_model_leaves(tmp_path):
    spec = spec_of(cnns("a", "b", "c", "d"))
    recorded = RecordedMembership(tmp_path, Ledger(rates4(), [3] * 4, total_gpus=4, gpus_per_node=4))
    recorded.membership.starter.ctx.spec = SimpleNamespace(seed=1, model=spec.model)
    recorded.membership.starter.ways = BundleWays(spec, (), recorded.log, recorded.log)
    recorded.log.bundle = lambda *args: None
    membership = recorded.membership
    membership.start_stream(0, [Member("a", (0,), ("a", "b", "c")), Member("d", (1,))], launching=1)
    bundle = next(c for c, _ in recorded.sent if isinstance(c, StartBundle))
    assert bundle.models == ("a", "b", "c") and bundle.ranks == (1,) and membership.books.groups_open == 4
    assert bundle.way == "fused"  # runtime.fuse: always
    assert [f["models"] for e, f in recorded.log.events if e == "bundle_formed"] == [["a", "b", "c"]]
    membership.checkpoint("a")
    membership.checkpoint("b")
    assert not any(isinstance(c, CheckpointModel) for c, _ in recorded.sent)
    membership.send_checkpoints()
    assert [(c, r) for c, r in recorded.sent if isinstance(c, CheckpointModel)] == [
        (CheckpointModel("a", ("a", "b")), 1)]
    live = membership.books.streams[0]
    assert live.leaving == set() and "Pause" not in recorded.names()  # c trains on in the bundle
    membership.leave(0, "c")  # c converged: the bundle leaves its stream
    assert live.leaving == {"a"} and "Pause" in recorded.names()
