"""Fused bundles in the runtime without processes (issue 49): `runtime.fuse` in the spec, which
bundles a job forms and why models are left apart, a bundle master's commands, and a bundle's
place in its stream's books."""

from types import SimpleNamespace

import numpy as np
import pytest

from fleet.engines.bundle import SequentialBundle, create_bundle
from fleet.engines.emulated import EmulatedEngine
from fleet.engines.options import EngineOptions
from fleet.runtime.control.fusing import Fusion, plan_fusion
from fleet.runtime.protocol import CheckpointModel, KeepAlive, RungVerdict, StartBundle, StartMember
from fleet.runtime.train.coordinator_link import CoordinatorLink
from fleet.schedule import Member, RateTable
from fleet.schedule.ledger import Ledger
from fleet.spec import Fuse, SpecError, parse_spec
from test_runtime_control_units import RecordedMembership, rates4

CNN = {"family": "cnn", "params": {"channels": [8], "hidden": 16}}


def spec_of(models: list[dict], fuse: str = "always", device: str = "cpu", **data):
    return parse_spec({"name": "f", "data": {"source": "digits", **data}, "models": models,
                       "cluster": {"device": device}, "runtime": {"fuse": fuse}}, check_paths=False)


def cnns(*names: str, **train) -> list[dict]:
    return [{**CNN, "name": n, "train": {"lr": 0.01 * (k + 1), **train}} for k, n in enumerate(names)]


# -- the spec ------------------------------------------------------------------------------------


def test_runtime_fuse_is_auto_always_or_never():
    assert spec_of(cnns("a"), fuse="auto").runtime.fuse is Fuse.AUTO
    assert parse_spec({"name": "f", "data": {"source": "digits"}, "models": cnns("a")}).runtime.fuse is Fuse.AUTO
    with pytest.raises(SpecError, match="runtime.fuse: Input should be 'auto', 'always' or 'never'"):
        spec_of(cnns("a"), fuse="yes")


def test_fuse_always_where_no_bundle_is_built_is_one_line():
    data = {"source": "hdf5", "path": "/x.h5", "group_by": {"dataset": "groups"}}
    with pytest.raises(SpecError, match=r"^runtime.fuse: always: bundles are not built for learning over groups"):
        parse_spec({"name": "f", "data": data, "models": cnns("a"), "runtime": {"fuse": "always"}}, check_paths=False)
    assert parse_spec({"name": "f", "data": data, "models": cnns("a"), "runtime": {"fuse": "auto"}},
                      check_paths=False).runtime.fuse is Fuse.AUTO


# -- which bundles a job forms ---------------------------------------------------------------------


def test_auto_fuses_on_cuda_only_and_says_so():
    models = cnns("a", "b", "c", "d")
    on_cpu = plan_fusion(spec_of(models, "auto"), list("abcd"), {}, 1)
    assert on_cpu.bundles == () and "no bundles on cpu trainers" in on_cpu.note
    assert plan_fusion(spec_of(models, "auto", "cuda"), list("abcd"), {}, 1).bundles == (("a", "b", "c", "d"),)
    assert plan_fusion(spec_of(models, "never", "cuda"), list("abcd"), {}, 1) == Fusion()
    alone = [*cnns("a"), {"family": "lstm", "name": "l"}]
    assert plan_fusion(spec_of(alone, "auto"), ["a", "l"], {}, 1) == Fusion()  # nothing to fuse: no line
    assert plan_fusion(spec_of(alone), ["a", "l"], {}, 1).note == "runtime.fuse always: no two models left may fuse"
    always = plan_fusion(spec_of(models), list("abcd"), {}, 1)
    assert always.bundles == (("a", "b", "c", "d"),) and always.refused == ()
    assert always.lines() == ["runtime.fuse always: 1 bundle(s) of 4 models, each trained as one fused model on "
                              "one cpu trainer; 0 model(s) apart"]


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
    recorded.log.bundle = lambda *args: None
    membership = recorded.membership
    membership.start_stream(0, [Member("a", (0,), ("a", "b", "c")), Member("d", (1,))], launching=1)
    bundle = next(c for c, _ in recorded.sent if isinstance(c, StartBundle))
    assert bundle.models == ("a", "b", "c") and bundle.ranks == (1,) and membership.books.groups_open == 4
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
