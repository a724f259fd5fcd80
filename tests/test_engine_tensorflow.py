"""The tensorflow engine behind the engine interface: the Keras zoo's twins of the torch
families (same parameter counts, FLOPs and outputs for the same weights), learning, data-parallel groups, checkpoints, the three
optimizers against `torch.optim`, user models and the framework's registration."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import keras  # noqa: E402
import torch  # noqa: E402

from fleet.engines import Engine, EngineOptions, EnginePhase, get_framework  # noqa: E402
from fleet.engines.tensorflow import FRAMEWORK, KerasZoo, TensorFlowEngine  # noqa: E402
from fleet.engines.tensorflow.zoo import BUILDERS, COUNTERS, trainable_count  # noqa: E402
from fleet.engines.torch import zoo as torch_zoo  # noqa: E402
from fleet.engines.factory import create_engine  # noqa: E402
from fleet.errors import UserCodeError, UserError  # noqa: E402
from fleet.rows import Pieces  # noqa: E402
from fleet.spec import LRSchedule, ModelSpec, TrainSpec, parse_spec  # noqa: E402
from fleet.spec.families import FAMILIES  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
SHAPE = (1, 8, 8)
CLASSES = 4
MLP = ("mlp", {"hidden": [32, 16], "dropout": 0.2})
CNN = ("cnn", {"channels": [4, 8], "hidden": 16, "dropout": 0.3})
RESNET = ("resnet", {"blocks": [1, 1, 1, 1], "width": 4})
DENSENET = ("densenet", {"blocks": [2, 2], "growth_rate": 4})
LSTM = ("lstm", {"hidden": 16, "bidirectional": True})


def model_spec(family: str, params: dict, seed: int = 11, model_id: str | None = None, **train) -> ModelSpec:
    return ModelSpec(id=model_id or f"{family}-000", family=family, params=params, train=TrainSpec(**train),
                     seed=seed, framework="tensorflow")


def engine(family_params=MLP, shape=SHAPE, **train) -> TensorFlowEngine:
    return FRAMEWORK.create_engine(EngineOptions(model_spec(*family_params, **train), shape, CLASSES))


def batches(count: int, size: int = 16, shape=SHAPE, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((size, *shape)).astype(np.float32), rng.integers(0, CLASSES, size))
            for _ in range(count)]


def learnable(count: int, shape=SHAPE, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Noisy images whose class is a fixed pattern added to them (learnable well above chance)."""
    rng = np.random.default_rng(seed)
    patterns = np.random.default_rng(99).standard_normal((CLASSES, *shape)).astype(np.float32)
    y = rng.integers(0, CLASSES, count)
    return (patterns[y] + 0.5 * rng.standard_normal((count, *shape))).astype(np.float32), y


# -- the zoo ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("family", "params", "shape"), [
    ("mlp", {}, (1, 8, 8)),
    ("mlp", {"hidden": []}, (3, 5, 7)),
    ("mlp", {"hidden": [64, 32, 8], "dropout": 0.5}, (2, 4, 4)),
    ("cnn", {}, (3, 32, 32)),
    ("cnn", {"channels": [4, 8], "hidden": 16}, (1, 8, 8)),
    ("cnn", {"channels": [3, 5, 7, 9], "hidden": 0, "kernel_size": 5}, (2, 6, 3)),
    ("cnn", {"channels": [8], "hidden": 10, "kernel_size": 1}, (1, 1, 9)),
    ("resnet", {}, (3, 32, 32)),
    ("resnet", {"blocks": [1, 1, 1, 1], "width": 4}, (1, 8, 8)),
    ("resnet", {"blocks": [1, 2, 1, 1], "width": 3, "bottleneck": True}, (3, 16, 16)),
    ("resnet", {"blocks": [2, 1, 1, 1], "width": 5}, (2, 5, 9)),
    ("resnet", {"blocks": [1, 1, 1, 1], "width": 2, "bottleneck": True}, (1, 1, 7)),
    ("densenet", {}, (3, 32, 32)),
    ("densenet", {"blocks": [2, 2], "growth_rate": 4}, (1, 8, 8)),
    ("densenet", {"blocks": [1, 2, 3, 1], "growth_rate": 5, "init_features": 7, "bn_size": 2, "compression": 0.3},
     (3, 16, 16)),
    ("densenet", {"blocks": [3], "growth_rate": 3}, (2, 5, 9)),
    ("densenet", {"blocks": [1, 1, 1, 1], "growth_rate": 2, "compression": 1.0}, (1, 1, 6)),
    ("lstm", {}, (1, 8, 8)),
    ("lstm", {"hidden": 16, "layers": 3, "bidirectional": True}, (3, 16, 16)),
    ("lstm", {"hidden": 7, "layers": 2}, (2, 5, 9)),
    ("lstm", {"hidden": 5, "bidirectional": True}, (1, 1, 1)),
])
def test_the_keras_twins_count_like_the_torch_families(family, params, shape):
    torch_stats = torch_zoo.describe(family, params, shape, CLASSES)
    net = KerasZoo().build(family, params, shape, CLASSES, seed=0)
    assert trainable_count(net) == torch_stats.parameters
    assert KerasZoo().describe(family, params, shape, CLASSES) == torch_stats
    assert KerasZoo().parameter_bytes(family, params, shape, CLASSES) == torch_zoo.parameter_bytes(
        family, params, shape, CLASSES)
    assert tuple(net(np.zeros((2, *shape), np.float32)).shape) == (2, CLASSES)


def test_the_same_seed_gives_the_same_weights_and_another_seed_others():
    first, again = engine(CNN), engine(CNN)
    assert np.array_equal(first.flat_parameters(), again.flat_parameters())
    other = FRAMEWORK.create_engine(EngineOptions(model_spec(*CNN, seed=12), SHAPE, CLASSES))
    assert not np.allclose(first.flat_parameters(), other.flat_parameters())
    assert first.flat_buffers().size == 2 * (4 + 8) and engine(MLP).flat_buffers().size == 0
    assert np.array_equal(engine(LSTM).flat_parameters(), engine(LSTM).flat_parameters())


def _created(net: keras.Model, kind: type) -> list:
    """`net`'s layers of `kind` in the order they were made (Keras lists them by depth)."""
    def made(layer) -> int:
        suffix = layer.name.rpartition("_")[2]  # conv2d, conv2d_1, ...: Keras numbers them as it makes them
        return int(suffix) if suffix.isdigit() else 0
    return sorted((layer for layer in net.layers if isinstance(layer, kind)), key=made)


def _load_torch_weights(source: torch.nn.Module, net: keras.Model) -> None:
    """Copy a torch network's weights and batch norm statistics into its Keras twin."""
    modules = lambda kind: [m for m in source.modules() if isinstance(m, kind)]  # noqa: E731
    kinds = [(torch.nn.Conv2d, keras.layers.Conv2D, lambda m: [m.weight.permute(2, 3, 1, 0)]),
             (torch.nn.BatchNorm2d, keras.layers.BatchNormalization,
              lambda m: [m.weight, m.bias, m.running_mean, m.running_var]),
             (torch.nn.Linear, keras.layers.Dense, lambda m: [m.weight.T, m.bias])]
    for torch_kind, keras_kind, values in kinds:
        pairs = list(zip(modules(torch_kind), _created(net, keras_kind), strict=True))
        for module, layer in pairs:
            layer.set_weights([v.detach().numpy() for v in values(module)])
    for lstm in modules(torch.nn.LSTM):
        directions = ("", "_reverse")[: 1 + lstm.bidirectional]
        suffixes = [f"_l{k}{d}" for k in range(lstm.num_layers) for d in directions]
        for suffix, rnn in zip(suffixes, _created(net, keras.layers.RNN), strict=True):
            rnn.set_weights([getattr(lstm, name + suffix).detach().numpy().T
                             for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")])


@pytest.mark.parametrize(("family", "params", "shape"), [
    ("resnet", {"blocks": [1, 1, 1, 1], "width": 4}, (1, 8, 8)),
    ("resnet", {"blocks": [1, 2, 1, 1], "width": 3, "bottleneck": True}, (3, 16, 16)),
    ("resnet", {"blocks": [2, 1, 1, 1], "width": 5}, (2, 6, 9)),
    ("densenet", {"blocks": [1, 2, 3, 1], "growth_rate": 5, "init_features": 7, "bn_size": 2, "compression": 0.3},
     (3, 16, 10)),
    ("lstm", {"hidden": 6, "layers": 2, "bidirectional": True}, (3, 6, 5)),
    ("lstm", {"hidden": 7}, (2, 5, 9)),
])
def test_the_keras_twins_compute_what_the_torch_families_compute(family, params, shape):
    """With torch's weights, a twin's logits are torch's: same layers, strided convs padded
    as torch pads them (on even maps too), same LSTM gates and time order."""
    source = torch_zoo.build_model(family, params, shape, CLASSES, seed=1).eval()
    with torch.no_grad():  # batch norm's affine parameters and statistics away from 1 and 0
        for value in [*source.parameters(), *(b for n, b in source.named_buffers() if "running" in n)]:
            value.add_(0.2 * torch.rand_like(value))
    net = KerasZoo().build(family, params, shape, CLASSES, seed=0)
    _load_torch_weights(source, net)
    x = np.random.default_rng(0).standard_normal((3, *shape)).astype(np.float32)
    expected = source(torch.from_numpy(x)).detach().numpy()
    np.testing.assert_allclose(np.asarray(net(x, training=False)), expected, rtol=1e-4,
                               atol=1e-5 * np.abs(expected).max())


def test_every_zoo_family_has_a_twin_and_an_unknown_one_is_one_line():
    assert set(BUILDERS) == set(COUNTERS) == set(FAMILIES)
    expected = r"^unknown family 'vgg' \(valid: cnn, densenet, lstm, mlp, resnet, or package.module:function\)$"
    with pytest.raises(UserError, match=expected):
        engine(("vgg", {}))
    with pytest.raises(UserError, match=expected):
        KerasZoo().describe("vgg", {}, SHAPE, CLASSES)


def test_bad_params_and_devices_are_one_line_user_errors():
    with pytest.raises(UserError, match="^family 'mlp': params"):
        engine(("mlp", {"width": 3}))
    for device in ("cuda:x", "gpu", "cuda:-1"):
        with pytest.raises(UserError, match=rf"^device '{device}': expected 'c"):
            FRAMEWORK.create_engine(EngineOptions(model_spec(*MLP), SHAPE, CLASSES, device=device))


@pytest.mark.skipif(bool(tf.config.list_physical_devices("GPU")), reason="a GPU is visible")
def test_a_cuda_device_without_a_gpu_says_which_wheel():
    with pytest.raises(UserError, match=r"^device 'cuda:0': TensorFlow sees 0 GPU\(s\) here \(is the tensorflow-cpu"):
        FRAMEWORK.create_engine(EngineOptions(model_spec(*MLP), SHAPE, CLASSES, device="cuda:0"))


BAD_USER_MODEL = '''
import keras

def listed(input_shape, num_classes):
    return [keras.layers.Dense(num_classes)]

def tiny(input_shape, num_classes, width=8):
    inputs = keras.Input(shape=input_shape)
    x = keras.layers.Flatten()(inputs)
    x = keras.layers.Dense(width, activation="relu")(x)
    return keras.Model(inputs, keras.layers.Dense(num_classes)(x))

def broken(input_shape, num_classes):
    return 1 / 0
'''


@pytest.fixture
def user_models(tmp_path, monkeypatch):
    (tmp_path / "fleet_tf_user_models.py").write_text(BAD_USER_MODEL)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "fleet_tf_user_models"


def test_a_user_model_trains_and_a_bad_one_is_one_line_naming_its_function(user_models):
    good = engine((f"{user_models}:tiny", {"width": 6}))
    assert good.num_parameters == 64 * 6 + 6 + 6 * CLASSES + CLASSES
    assert np.array_equal(engine((f"{user_models}:tiny", {"width": 6})).flat_parameters(), good.flat_parameters())
    x, y = batches(1)[0]
    assert np.isfinite(good.train_step(x, y))
    with pytest.raises(UserCodeError) as caught:
        engine((f"{user_models}:listed", {}))
    assert str(caught.value) == f"family '{user_models}:listed': listed() returned a list, expected a keras.Model"
    broken = r"^family '\w+:broken': broken\(\) raised ZeroDivisionError: division by zero$"
    with pytest.raises(UserCodeError, match=broken):
        engine((f"{user_models}:broken", {}))


# -- training -----------------------------------------------------------------------------------


@pytest.mark.parametrize("family_params", [MLP, CNN, RESNET, DENSENET, LSTM],
                         ids=["mlp", "cnn", "resnet", "densenet", "lstm"])
def test_a_zoo_model_learns_a_learnable_set(family_params):
    trainee = engine(family_params, lr=0.05)
    x, y = learnable(512)
    test_x, test_y = learnable(256, seed=1)
    before = trainee.evaluate(test_x, test_y)
    for _ in range(3):
        for i in range(0, len(x), 32):
            trainee.train_step(x[i : i + 32], y[i : i + 32])
        trainee.end_epoch()
    after = trainee.evaluate(test_x, test_y, batch_size=100)
    assert after["accuracy"] > 0.8 and after["loss"] < before["loss"]
    assert trainee.epoch == 3 and trainee.steps == 48 and trainee.phase is EnginePhase.TRAINING


def test_the_probabilities_kept_are_the_evaluation_passs_softmax_and_predict_gives_the_same():
    trainee = engine(CNN, lr=0.05)
    x, y = learnable(96)
    for i in range(0, len(x), 32):
        trainee.train_step(x[i : i + 32], y[i : i + 32])
    test_x, test_y = learnable(70, seed=1)
    metrics, probabilities = trainee.evaluate_with_probabilities(test_x, test_y, batch_size=32)
    assert metrics == pytest.approx(trainee.evaluate(test_x, test_y, batch_size=32))
    assert probabilities.dtype == np.float32 and probabilities.shape == (70, CLASSES)
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, atol=1e-5)
    picked = probabilities[np.arange(70), test_y]
    assert float(-np.log(picked).mean()) == pytest.approx(metrics["loss"], rel=1e-4)
    np.testing.assert_allclose(trainee.predict(test_x, batch_size=50), probabilities, atol=1e-6)


def shard_average_step(replicas: list[TensorFlowEngine], x: np.ndarray, y: np.ndarray) -> float:
    """One data-parallel step by hand: each replica its equal shard, the gradient buffers
    averaged, loaded and applied everywhere; returns the mean of the shards' losses."""
    m = len(replicas)
    losses = [r.compute_gradients(xs, ys) for r, xs, ys in zip(replicas, np.split(x, m), np.split(y, m))]
    average = sum(r.gradient_buffer() for r in replicas) / m
    for replica in replicas:
        replica.load_flat_gradients(average)
        replica.apply_gradients()
    return float(np.mean(losses))


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_two_replicas_on_half_batches_follow_one_engine_on_the_whole(optimizer):
    mlp = ("mlp", {"hidden": [32, 16]})
    single, pair = engine(mlp, optimizer=optimizer), [engine(mlp, optimizer=optimizer) for _ in range(2)]
    for x, y in batches(3, size=16):
        assert shard_average_step(pair, x, y) == pytest.approx(single.train_step(x, y), rel=1e-5)
    for r in pair:
        np.testing.assert_allclose(r.flat_parameters(), single.flat_parameters(), rtol=1e-5, atol=1e-6)
        assert not r.gradient_buffer().any()


def test_cnn_replicas_stay_equal_but_batch_norm_sees_only_its_shard():
    """As with torch: batch norm normalises by the shard's statistics, so a pair of cnn replicas
    stays equal to each other but not to one engine on the whole batch."""
    cnn = ("cnn", {"channels": [4, 8], "hidden": 16})
    single, pair = engine(cnn), [engine(cnn) for _ in range(2)]
    for x, y in batches(2, size=16):
        shard_average_step(pair, x, y)
        single.train_step(x, y)
    np.testing.assert_array_equal(pair[0].flat_parameters(), pair[1].flat_parameters())
    assert not np.allclose(pair[0].flat_parameters(), single.flat_parameters(), rtol=1e-5, atol=1e-6)
    assert not np.array_equal(pair[0].flat_buffers(), pair[1].flat_buffers())  # each its own shard's statistics


def test_the_factory_builds_it_for_a_tensorflow_model_and_a_batch_in_pieces_trains_as_joined():
    # TF has started: threads are left as they are
    whole = create_engine(EngineOptions(model_spec(*MLP), SHAPE, CLASSES, threads=1))
    split = create_engine(EngineOptions(model_spec(*MLP), SHAPE, CLASSES))
    assert isinstance(whole, TensorFlowEngine) and whole.device == "cpu"
    for x, y in batches(2):
        assert split.train_step(Pieces((x[:5], x[5:7], x[7:])), y) == whole.train_step(x, y)
    np.testing.assert_array_equal(split.flat_parameters(), whole.flat_parameters())


def test_the_gradient_buffer_is_the_flat_gradients_and_scales_in_place():
    trainee = engine(MLP)
    buffer = trainee.gradient_buffer()
    trainee.compute_gradients(*batches(1)[0])
    assert trainee.flat_gradients() is buffer and buffer.dtype == np.float32 and buffer.any()
    copy = buffer.copy()
    trainee.scale_gradients(0.5)
    np.testing.assert_array_equal(buffer, copy * np.float32(0.5))
    trainee.load_flat_gradients(buffer)
    trainee.apply_gradients()
    assert trainee.gradient_buffer() is buffer and not buffer.any()


# -- checkpoints ------------------------------------------------------------------------------


def _run(trainee: Engine, data, epoch_every: int = 3) -> list[float]:
    losses = []
    for i, (x, y) in enumerate(data):
        losses.append(trainee.train_step(x, y))
        if i % epoch_every == epoch_every - 1:
            trainee.end_epoch()
    return losses


@pytest.mark.parametrize("optimizer", ["sgd", "adam", "adamw"])
def test_a_restored_engine_continues_with_the_same_losses(optimizer):
    train = {"optimizer": optimizer, "lr": 0.01, "schedule": LRSchedule(kind="step", step_epochs=1, gamma=0.5),
             "max_epochs": 4}
    data = batches(8)
    straight = engine(CNN, **train)
    first = _run(straight, data[:4])
    saved = straight.state_bytes()
    rest = _run(straight, data[4:])
    restored = engine(CNN, **train)
    restored.load_state_bytes(saved)
    assert restored.epoch == 1 and restored.steps == 4 and restored.lr == straight.spec.train.lr * 0.5
    assert restored.phase is EnginePhase.BUILT
    assert _run(restored, data[4:]) == rest  # dropout, optimizer state, schedule: all restored
    np.testing.assert_array_equal(restored.flat_parameters(), straight.flat_parameters())
    np.testing.assert_array_equal(restored.flat_buffers(), straight.flat_buffers())
    assert first != rest


def test_a_state_of_another_model_or_kind_is_refused():
    saved = engine(MLP).state()
    other = FRAMEWORK.create_engine(EngineOptions(model_spec(*MLP, model_id="other"), SHAPE, CLASSES))
    with pytest.raises(UserError, match="^checkpoint of model 'mlp-000' cannot be loaded into model 'other'$"):
        other.load_state(saved)
    with pytest.raises(UserError, match="not a tensorflow engine state"):
        other.load_state({"format": "fleet.torch_engine/1"})
    with pytest.raises(UserError, match="engine state refused"):
        other.load_state_bytes(b"not a checkpoint")


# -- optimizers against torch.optim -----------------------------------------------------------

TORCH_OPTIMIZERS = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}


@pytest.mark.parametrize(("optimizer", "momentum", "weight_decay"), [
    ("sgd", 0.9, 5e-4), ("sgd", 0.0, 0.0), ("sgd", 0.5, 0.1), ("adam", 0.9, 0.0), ("adam", 0.9, 0.01),
    ("adamw", 0.9, 0.01), ("adamw", 0.9, 0.0),
])
def test_each_optimizer_updates_as_torch_optim_does_as_the_rate_changes(optimizer, momentum, weight_decay):
    schedule = LRSchedule(kind="step", step_epochs=1, gamma=0.5, warmup_epochs=1)
    trainee = engine(("mlp", {"hidden": [5]}), optimizer=optimizer, lr=0.03, momentum=momentum,
                     weight_decay=weight_decay, schedule=schedule, max_epochs=4)
    param = torch.nn.Parameter(torch.from_numpy(trainee.flat_parameters()))
    options = {"momentum": momentum} if optimizer == "sgd" else {}
    reference = TORCH_OPTIMIZERS[optimizer]([param], lr=trainee.lr, weight_decay=weight_decay, **options)
    rng = np.random.default_rng(5)
    for step in range(8):
        grads = rng.standard_normal(trainee.num_parameters).astype(np.float32)
        trainee.load_flat_gradients(grads)
        trainee.apply_gradients()
        param.grad = torch.from_numpy(grads.copy())
        reference.step()
        np.testing.assert_allclose(trainee.flat_parameters(), param.detach().numpy(), rtol=1e-6, atol=1e-7)
        if step % 2:
            trainee.end_epoch()
            reference.param_groups[0]["lr"] = trainee.lr
    assert trainee.lr == 0.03 * 0.5**3  # used: 0.015 (warm-up), 0.03, 0.015, 0.0075


@pytest.mark.parametrize("optimizer", ["sgd", "adam", "adamw"])
def test_a_lone_trainers_step_makes_no_host_copy_and_equals_the_groups_path(optimizer):
    """Without a collective the gradients stay in TF (the host buffer is not written), in two
    calls or in `train_step`'s one; a group's step goes through the host buffer: the same
    parameters and optimizer state, bit for bit."""
    lone, fused, grouped = (engine(MLP, optimizer=optimizer) for _ in range(3))
    buffer = lone.gradient_buffer()
    for x, y in batches(4):
        loss = lone.compute_gradients(x, y)
        lone.apply_gradients()
        assert not buffer.any()
        assert fused.train_step(x, y) == loss and not fused.gradient_buffer().any()
        assert grouped.compute_gradients(x, y) == loss
        grouped.load_flat_gradients(grouped.gradient_buffer().copy())
        grouped.apply_gradients()
    for trainee in (fused, grouped):
        np.testing.assert_array_equal(trainee.flat_parameters(), lone.flat_parameters())
        for name, slot in lone.state()["optimizer"]["slots"].items():
            np.testing.assert_array_equal(trainee.state()["optimizer"]["slots"][name], slot)
    assert lone.steps == fused.steps == grouped.steps == 4


def test_steps_retrace_nothing_whatever_the_rate_or_batch_size():
    trainee = engine(MLP, optimizer="adam", schedule=LRSchedule(kind="cosine"), max_epochs=5)

    def every_path(x: np.ndarray, y: np.ndarray) -> None:
        trainee.train_step(x, y)  # a lone trainer's fused step
        trainee.compute_gradients(x, y)
        trainee.apply_gradients()  # the gradients as TF computed them
        trainee.compute_gradients(x, y)
        trainee.load_flat_gradients(trainee.gradient_buffer())
        trainee.apply_gradients()  # a group's: from the host buffer

    every_path(*batches(1, size=16)[0])
    traces = trainee.traces
    for size in (16, 12, 16, 5, 7):
        for x, y in batches(2, size=size):
            every_path(x, y)
        trainee.end_epoch()
    assert trainee.traces == traces + 2  # both gradient steps once more for a batch of any size; none per rate


def test_the_optimizer_state_is_plain_arrays_and_a_wrong_one_is_refused():
    trainee = engine(MLP, optimizer="adamw")
    assert trainee.state()["optimizer"] == {"kind": "adamw", "step": 0, "slots": {}}
    for x, y in batches(2):
        trainee.train_step(x, y)
    optimizer = trainee.state()["optimizer"]
    assert optimizer["step"] == 2 and set(optimizer["slots"]) == {"exp_avg", "exp_avg_sq"}
    assert all(v.dtype == np.float32 and v.shape == (trainee.num_parameters,) for v in optimizer["slots"].values())
    state = trainee.state()
    del state["optimizer"]["slots"]["exp_avg_sq"]
    with pytest.raises(UserError, match="does not fit its network: optimizer state of 'adamw'"):
        engine(MLP, optimizer="adamw").load_state(state)


# -- the framework ----------------------------------------------------------------------------


def test_a_spec_may_name_tensorflow_and_the_registry_gives_its_framework():
    doc = {"name": "t", "data": {"source": "digits"},
           "models": [{"family": "mlp", "name": "a", "framework": "tensorflow"}, {"family": "cnn", "name": "b"}]}
    spec = parse_spec(doc)
    assert {m.id: m.framework for m in spec.models} == {"a": "tensorflow", "b": "torch"}
    assert parse_spec({**doc, "framework": "tensorflow"}).framework == "tensorflow"
    assert get_framework("tensorflow") is FRAMEWORK and FRAMEWORK.name == "tensorflow"
    assert FRAMEWORK.visible_gpus() == len(tf.config.list_physical_devices("GPU"))
    assert FRAMEWORK.free_device_memory("cpu") is None
    assert FRAMEWORK.version().count(".") >= 2 and FRAMEWORK.device_name("cpu").startswith("cpu (")
    FRAMEWORK.synchronize("cpu")
    FRAMEWORK.release_memory("cpu")


def _imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            roots.add(node.module.split(".")[0])
    return roots


def test_only_the_tensorflow_package_imports_tensorflow_or_keras():
    package = REPO / "fleet" / "engines" / "tensorflow"
    sources = [p for root in ("fleet", "preprocess", "profiler") for p in (REPO / root).rglob("*.py")]
    importers = {str(p.relative_to(REPO)) for p in sources
                 if _imported_roots(p) & {"tensorflow", "keras"} and package not in p.parents}
    assert importers == set()


def test_importing_the_framework_says_nothing_on_stderr():
    env = {k: v for k, v in os.environ.items() if not k.startswith("TF_")}
    done = subprocess.run([sys.executable, "-c", "import fleet.engines.tensorflow"], capture_output=True, text=True,
                          cwd=REPO, timeout=120, env={**env, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0 and done.stderr == "" and done.stdout == ""
