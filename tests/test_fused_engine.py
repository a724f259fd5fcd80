"""The fused torch engine (`FusedTorchEngine`): each member trains as its own `TorchEngine` would
on the same batches (parity, per fusable zoo family); a member leaves and joins as an ordinary
model's state; and which models may fuse, with the reasons (`fleet.engines.fusion`).

Tolerance. A member's weights are compared with its own engine's after `STEPS` steps with
``rtol=1e-4, atol=1e-5`` (weights of order 0.1-1). The fused forward is the same arithmetic in
another summation order (vmap turns the members' convolutions into one grouped convolution,
their linear layers into a batched matmul, and batch norm's affine part into separate
operations), so each step differs by float32 rounding, ~1e-7 relative; measured after 8 steps:
at most 3e-7 (SGD, all four families) and 3e-6 (Adam on densenet). Rounding grows over steps,
and a ReLU whose input is within rounding of 0 can switch the gradient: the nets and batches
here are fixed (seeded) and were checked clear of that (the resnet's images are 16x16, so that
its last stage's batch norm normalises 4 values per sample rather than 1: on 8x8 images one
ReLU switch moved its member by 2e-4 in 16 steps: the engine alone, its weights moved by 1e-7
at that step, sees one gradient entry change by 0.06); Adam, which divides by the gradient's
running magnitude, turns such a switch into a jump of order lr, so it is checked on the
families whose nets have no batch norm in 1x1 maps (mlp, cnn) and on the optimizer directly.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fleet.engines import EngineOptions
from fleet.engines.fusion import (
    bundle_refusal,
    family_refusal,
    fusable_groups,
    fusion_key,
    model_refusal,
    pair_refusal,
)
from fleet.engines.torch import TorchEngine
from fleet.engines.torch.fused import FusedTorchEngine
from fleet.engines.torch.fused_optim import StackedUpdate
from fleet.engines.torch.optim import ParamUpdate
from fleet.engines.torch.zoo import build_model
from fleet.errors import UserError
from fleet.spec import ModelSpec, TrainSpec

SHAPE = (1, 8, 8)
SHAPES = {"resnet": (1, 16, 16)}  # its last stage's batch norm over 2x2 maps, not 1x1: see the tolerance above
CLASSES = 4
STEPS = 8
RTOL, ATOL = 1e-4, 1e-5
FAMILIES = {
    "cnn": {"channels": [4, 8], "hidden": 16, "dropout": 0.3},
    "resnet": {"blocks": [1, 1, 1, 1], "width": 4},
    "densenet": {"blocks": [2, 2], "growth_rate": 4},
    "mlp": {"hidden": [32, 16], "dropout": 0.2},
}
# members differ in everything a bundle lets them differ in: lr, momentum, weight decay, schedule, epochs, seed
SETTINGS = (
    {"lr": 0.05, "momentum": 0.9},
    {"lr": 0.1, "momentum": 0.0, "weight_decay": 0.0},
    {"lr": 0.02, "momentum": 0.5, "weight_decay": 1e-3, "schedule": {"kind": "cosine"}, "max_epochs": 3},
)


def member(family: str, k: int, params: dict | None = None, **train) -> ModelSpec:
    settings = {**SETTINGS[k % len(SETTINGS)], **train}
    return ModelSpec(id=f"{family}-{k:03d}", family=family, params=FAMILIES[family] if params is None else params,
                     train=TrainSpec(**settings), seed=100 + k)


def options(model: ModelSpec) -> EngineOptions:
    return EngineOptions(model, SHAPES.get(model.family, SHAPE), CLASSES)


def batches(count: int, size: int = 16, seed: int = 0, family: str = "") -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    shape = SHAPES.get(family, SHAPE)
    return [(rng.standard_normal((size, *shape)).astype(np.float32), rng.integers(0, CLASSES, size))
            for _ in range(count)]


def train_both(bundle: FusedTorchEngine, engines: list[TorchEngine], data, epoch_every: int = 4) -> None:
    """The same batches to the bundle and to each engine; every member's epoch ends every `epoch_every`."""
    for step, (x, y) in enumerate(data, start=1):
        fused = bundle.train_step(x, y)
        alone = {engine.model_id: engine.train_step(x, y) for engine in engines}
        assert fused.keys() == alone.keys()
        np.testing.assert_allclose([fused[k] for k in alone], list(alone.values()), rtol=RTOL, atol=ATOL)
        if step % epoch_every == 0:
            for engine in engines:
                bundle.end_epoch(engine.model_id)
                engine.end_epoch()


def assert_member_is(bundle: FusedTorchEngine, engine: TorchEngine) -> None:
    """The member's weights, running statistics, optimizer state and counters are the engine's."""
    ours, theirs = bundle.member_state(engine.model_id), engine.state()
    assert list(ours) == list(theirs)
    np.testing.assert_allclose(bundle.member_parameters(engine.model_id), engine.flat_parameters(),
                               rtol=RTOL, atol=ATOL)
    assert ours["model"].keys() == theirs["model"].keys()
    for key, tensor in theirs["model"].items():
        assert ours["model"][key].dtype == tensor.dtype, key
        np.testing.assert_allclose(ours["model"][key].numpy(), tensor.numpy(), rtol=RTOL, atol=ATOL, err_msg=key)
    assert ours["optimizer"]["param_groups"] == theirs["optimizer"]["param_groups"]
    assert ours["optimizer"]["state"].keys() == theirs["optimizer"]["state"].keys()
    for index, slots in theirs["optimizer"]["state"].items():
        for name, value in slots.items():
            np.testing.assert_allclose(ours["optimizer"]["state"][index][name].numpy(), value.numpy(),
                                       rtol=RTOL, atol=ATOL)
    assert (ours["epoch"], ours["steps"]) == (theirs["epoch"], theirs["steps"])
    assert torch.equal(ours["rng"]["generator"], theirs["rng"]["generator"])
    assert bundle.lr(engine.model_id) == engine.lr


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_fused_member_trains_as_its_own_engine(family):
    models = [member(family, k) for k in range(3)]
    bundle = FusedTorchEngine([options(m) for m in models])
    engines = [TorchEngine(options(m)) for m in models]
    train_both(bundle, engines, batches(STEPS, family=family))
    for engine in engines:
        assert_member_is(bundle, engine)
    assert len({bundle.lr(m.id) for m in models}) == 3  # the per-member schedules held


@pytest.mark.parametrize("optimizer", ["adam", "adamw"])
@pytest.mark.parametrize("family", ["cnn", "mlp"])
def test_adam_members_train_as_their_own_engines(family, optimizer):
    models = [member(family, k, optimizer=optimizer, lr=0.001 * (k + 1)) for k in range(3)]
    bundle = FusedTorchEngine([options(m) for m in models])
    engines = [TorchEngine(options(m)) for m in models]
    train_both(bundle, engines, batches(STEPS))
    for engine in engines:
        assert_member_is(bundle, engine)


@pytest.mark.parametrize("optimizer", ["sgd", "adam", "adamw"])
def test_the_stacked_update_is_the_engines_update_member_by_member(optimizer):
    """Given the same gradients, each row steps as `ParamUpdate` steps that member alone; one
    member joins late (its own step count: Adam's bias corrections)."""
    trains = [TrainSpec(optimizer=optimizer, **SETTINGS[k]) for k in range(3)]
    rng = np.random.default_rng(3)
    start = [torch.from_numpy(rng.standard_normal((2, 5)).astype(np.float32)) for _ in trains]
    alone = [torch.nn.Parameter(p.clone()) for p in start]
    singles = [ParamUpdate([p], train) for p, train in zip(alone, trains)]
    stacked = StackedUpdate(trains[0].optimizer, 10, torch.device("cpu"))
    rows = torch.zeros((0, 10))
    for step in range(6):
        if step in (0, 2):  # members 0 and 1 from the start, member 2 after two of their steps
            for k in ([0, 1] if step == 0 else [2]):
                stacked.append(trains[k], trains[k].lr, singles[k])
                rows = torch.cat([rows, alone[k].detach().reshape(1, -1)])
        grads = torch.from_numpy(rng.standard_normal(rows.shape).astype(np.float32))
        stacked.step(rows, grads)
        for k in range(len(rows)):
            alone[k].grad = grads[k].reshape(2, 5).clone()
            singles[k].step()
    for k, param in enumerate(alone):
        np.testing.assert_allclose(rows[k].numpy(), param.detach().reshape(-1).numpy(), rtol=1e-6, atol=1e-7)
        ours = stacked.member_state(k, [param.shape])
        assert ours["param_groups"] == singles[k].state_dict()["param_groups"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("family", ["cnn", "resnet"])
def test_cuda_members_train_as_their_own_cuda_engines(family):
    """On a GPU, deterministic kernels on both sides; cuDNN's grouped and plain convolutions sum
    in other orders than the CPU's, hence the looser tolerance (still far below a step's size)."""
    models = [member(family, k) for k in range(3)]
    on_gpu = [EngineOptions(m, SHAPES.get(family, SHAPE), CLASSES, device="cuda", deterministic=True) for m in models]
    bundle = FusedTorchEngine(on_gpu)
    engines = [TorchEngine(o) for o in on_gpu]
    for x, y in batches(STEPS, family=family):
        bundle.train_step(x, y)
        for engine in engines:
            engine.train_step(x, y)
    for engine in engines:
        np.testing.assert_allclose(bundle.member_parameters(engine.model_id), engine.flat_parameters(),
                                   rtol=1e-3, atol=1e-4)
    moved = TorchEngine(options(models[0]))  # a member's CUDA state loads on the CPU
    moved.load_state_bytes(bundle.member_state_bytes(models[0].id))
    assert np.array_equal(moved.flat_parameters(), bundle.member_parameters(models[0].id))


def test_a_member_leaves_and_trains_on_alone_the_others_undisturbed():
    models = [member("cnn", k) for k in range(3)]
    bundle = FusedTorchEngine([options(m) for m in models])
    engines = [TorchEngine(options(m)) for m in models]
    data = batches(2 * STEPS)
    train_both(bundle, engines, data[:STEPS])
    leaving = TorchEngine(options(models[1]))
    leaving.load_state_bytes(FusedTorchEngine.codec.encode(bundle.leave(models[1].id)))
    assert bundle.model_ids == [models[0].id, models[2].id]
    train_both(bundle, [engines[0], engines[2]], data[STEPS:])
    for x, y in data[STEPS:]:
        engines[1].train_step(x, y)
        leaving.train_step(x, y)
    for engine in (engines[0], engines[2]):
        assert_member_is(bundle, engine)
    np.testing.assert_allclose(leaving.flat_parameters(), engines[1].flat_parameters(), rtol=RTOL, atol=ATOL)


def test_a_model_joins_from_its_engines_state_and_trains_on_as_its_engine():
    models = [member("resnet", k) for k in range(3)]
    data = batches(2 * STEPS, family="resnet")
    engines = [TorchEngine(options(m)) for m in models]
    for x, y in data[:3]:  # the newcomer trained alone for three steps and one epoch
        engines[2].train_step(x, y)
    engines[2].end_epoch()
    bundle = FusedTorchEngine([options(m) for m in models[:2]])
    train_both(bundle, engines[:2], data[:STEPS])
    bundle.join(options(models[2]), engines[2].state())
    assert bundle.epoch(models[2].id) == 1 and bundle.steps(models[2].id) == 3
    train_both(bundle, engines, data[STEPS:])
    for engine in engines:
        assert_member_is(bundle, engine)


def test_member_state_bytes_resume_a_bundle_exactly():
    models = [member("mlp", k) for k in range(2)]
    data = batches(6)
    bundle = FusedTorchEngine([options(m) for m in models])
    for x, y in data[:3]:
        bundle.train_step(x, y)
    saved = {m.id: TorchEngine.codec.decode(bundle.member_state_bytes(m.id)) for m in models}
    resumed = FusedTorchEngine([options(m) for m in models], states=saved)
    for x, y in data[3:]:
        assert resumed.train_step(x, y) == bundle.train_step(x, y)  # bit-identical: the same arithmetic
    for m in models:
        assert np.array_equal(resumed.member_parameters(m.id), bundle.member_parameters(m.id))


def test_evaluate_gives_each_member_its_own_engines_metrics():
    models = [member("cnn", k) for k in range(2)]
    bundle = FusedTorchEngine([options(m) for m in models])
    engines = [TorchEngine(options(m)) for m in models]
    train_both(bundle, engines, batches(4))
    x, y = batches(1, size=40, seed=9)[0]
    fused = bundle.evaluate(x, y, batch_size=16)
    for engine in engines:
        alone = engine.evaluate(x, y, batch_size=16)
        assert fused[engine.model_id]["accuracy"] == pytest.approx(alone["accuracy"])
        assert fused[engine.model_id]["loss"] == pytest.approx(alone["loss"], rel=1e-4)


def test_what_cannot_fuse_says_why():
    assert family_refusal("cnn") is None and family_refusal("densenet") is None
    assert "vmap" in family_refusal("lstm") and "lstm" in family_refusal("lstm")
    assert "user model" in family_refusal("mypkg.nets:tiny")
    cnn = member("cnn", 0)
    assert model_refusal(cnn) is None
    assert "tensorflow" in model_refusal(cnn.model_copy(update={"framework": "tensorflow"}))
    wider = member("cnn", 1, params={**FAMILIES["cnn"], "channels": [4, 16]})
    assert pair_refusal(cnn, wider) == "models 'cnn-000' and 'cnn-001' differ in params: channels"
    assert pair_refusal(cnn, member("cnn", 1, params={**FAMILIES["cnn"], "kernel_size": 3})) is None  # a default
    assert "optimizers sgd and adam" in pair_refusal(cnn, member("cnn", 1, optimizer="adam"))
    assert "batch sizes 32 and 64" in pair_refusal(cnn, member("cnn", 1, batch_size=64))
    assert "families 'cnn' and 'mlp'" in pair_refusal(cnn, member("mlp", 1))
    assert bundle_refusal([cnn, cnn]) == "model 'cnn-000' appears twice in the bundle"
    assert bundle_refusal([cnn, member("cnn", 1), member("cnn", 2)]) is None
    assert fusion_key(cnn) == fusion_key(member("cnn", 2)) and fusion_key(member("lstm", 0, params={})) is None


def test_fusable_groups_gather_what_may_fuse():
    models = [member("cnn", 0), member("lstm", 1, params={}), member("cnn", 2, optimizer="adam"),
              member("cnn", 3), member("lstm", 4, params={})]
    assert fusable_groups(models) == [["cnn-000", "cnn-003"], ["lstm-001"], ["cnn-002"], ["lstm-004"]]


def test_a_bundle_refuses_what_cannot_fuse():
    with pytest.raises(UserError, match="cannot fuse: .*vmap"):
        FusedTorchEngine([options(member("lstm", 0, params={"hidden": 8}))])
    bundle = FusedTorchEngine([options(member("cnn", 0))])
    with pytest.raises(UserError, match="cannot join the bundle: .*differ in params: hidden"):
        bundle.join(options(member("cnn", 1, params={**FAMILIES["cnn"], "hidden": 8})))
    with pytest.raises(ValueError, match="num_classes"):
        bundle.join(EngineOptions(member("cnn", 2), SHAPE, CLASSES + 1))
    with pytest.raises(UserError, match="cannot be loaded into model 'cnn-003'"):
        bundle.join(options(member("cnn", 3)), TorchEngine(options(member("cnn", 4))).state())
    with pytest.raises(ValueError, match="last member"):
        bundle.leave("cnn-000")
    with pytest.raises(KeyError, match="not in the bundle"):
        bundle.leave("cnn-999")


def test_torch_still_cannot_vmap_an_lstm():
    """The reason `family_refusal` gives for the LSTM family: when torch gains the batching
    rule, this fails, and the LSTM family can be made fusable."""
    net = build_model("lstm", {"hidden": 8}, SHAPE, CLASSES, seed=0)
    stacked = torch.func.stack_module_state([net, build_model("lstm", {"hidden": 8}, SHAPE, CLASSES, seed=1)])
    base = build_model("lstm", {"hidden": 8}, SHAPE, CLASSES)

    def forward(params, buffers, x):
        return torch.func.functional_call(base, (params, buffers), (x,))

    with pytest.raises(RuntimeError, match="lstm"):
        torch.func.vmap(forward, in_dims=(0, 0, None))(*stacked, torch.zeros((2, *SHAPE)))
