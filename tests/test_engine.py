"""The torch engine: determinism, checkpoints, data-parallel primitives, schedules, learning."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fleet.engines import Engine, EngineOptions, EnginePhase
from fleet.engines.factory import create_engine
from fleet.engines.schedule import learning_rate
from fleet.engines.torch import TorchEngine
from fleet.errors import UserError
from fleet.rows import Pieces
from fleet.spec import LRSchedule, ModelSpec, TrainSpec

MNIST_LIKE = (1, 8, 8)
CLASSES = 4


def model_spec(family: str, params: dict, seed: int = 11, model_id: str | None = None, **train) -> ModelSpec:
    return ModelSpec(
        id=model_id or f"{family}-000", family=family, params=params, train=TrainSpec(**train), seed=seed
    )


def batches(count: int, size: int = 16, shape=MNIST_LIKE, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [
        (rng.standard_normal((size, *shape)).astype(np.float32), rng.integers(0, CLASSES, size))
        for _ in range(count)
    ]


CNN = ("cnn", {"channels": [4, 8], "hidden": 16, "dropout": 0.3})
RESNET = ("resnet", {"blocks": [1, 1, 1, 1], "width": 4})
MLP = ("mlp", {"hidden": [32, 16]})
LSTM = ("lstm", {"hidden": 12, "layers": 2})


def torch_engine(model: ModelSpec, **options) -> TorchEngine:
    """A torch engine of `model` on MNIST-like samples; `options`: device, threads, deterministic."""
    return TorchEngine(EngineOptions(model, MNIST_LIKE, CLASSES, **options))


def test_create_engine_gives_a_seeded_engine():
    engine = create_engine(EngineOptions(model_spec(*MLP), MNIST_LIKE, CLASSES))
    assert isinstance(engine, Engine)
    assert engine.model_id == "mlp-000"
    assert engine.device == torch.device("cpu")
    assert engine.num_parameters == (64 * 32 + 32) + (32 * 16 + 16) + (16 * 4 + 4)
    assert engine.phase is EnginePhase.BUILT
    engine.train_step(*batches(1)[0])
    assert engine.phase is EnginePhase.TRAINING


@pytest.mark.parametrize("family_params", [CNN, RESNET], ids=["cnn-dropout", "resnet-bn"])
def test_same_model_spec_gives_bit_identical_losses(family_params):
    data = batches(5)
    a, b = (torch_engine(model_spec(*family_params)) for _ in range(2))
    assert np.array_equal(a.flat_parameters(), b.flat_parameters())
    assert [a.train_step(x, y) for x, y in data] == [b.train_step(x, y) for x, y in data]


ON_CUDA_TOO = ["cpu", pytest.param("cuda:0", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"))]


@pytest.mark.parametrize("device", ON_CUDA_TOO)
def test_a_batch_in_pieces_trains_as_the_joined_batch(device):
    data = batches(3, size=12)
    whole, pieces = (torch_engine(model_spec(*CNN), device=device, deterministic=True)
                     for _ in range(2))
    for x, y in data:
        split = Pieces((x[:5], x[5:7], x[7:]))
        assert whole.train_step(x, y) == pieces.train_step(split, y)
    assert np.array_equal(whole.flat_parameters(), pieces.flat_parameters())


def test_another_seed_gives_other_weights():
    a = torch_engine(model_spec(*MLP, seed=1))
    b = torch_engine(model_spec(*MLP, seed=2))
    assert not np.array_equal(a.flat_parameters(), b.flat_parameters())


def test_train_step_is_compute_then_apply():
    data = batches(3)
    a, b = (torch_engine(model_spec(*CNN, optimizer="adam", lr=0.01)) for _ in range(2))
    for x, y in data:
        loss_a = a.train_step(x, y)
        loss_b = b.compute_gradients(x, y)
        b.apply_gradients()
        assert loss_a == loss_b
    assert np.array_equal(a.flat_parameters(), b.flat_parameters())


def continue_training(engine: Engine, data) -> list[float]:
    return [engine.train_step(x, y) for x, y in data]


@pytest.mark.parametrize(
    ("family_params", "train"),
    [(CNN, {"optimizer": "adam", "lr": 0.01}), (RESNET, {"schedule": "cosine"}), (LSTM, {"optimizer": "adamw"})],
    ids=["cnn-adam", "resnet-sgd-cosine", "lstm-adamw"],
)
def test_state_resumes_exactly(family_params, train):
    spec = model_spec(*family_params, **train)
    before, after = batches(3, seed=1), batches(3, seed=2)
    original = torch_engine(spec)
    continue_training(original, before)
    original.end_epoch()
    snapshot, original_bytes = original.state(), original.state_bytes()
    expected = continue_training(original, after)

    resumed = torch_engine(spec)
    resumed.load_state(snapshot)
    assert (resumed.epoch, resumed.steps, resumed.lr) == (1, 3, original.lr)
    assert continue_training(resumed, after) == expected

    from_disk = torch_engine(spec)
    from_disk.load_state_bytes(original_bytes)
    assert continue_training(from_disk, after) == expected
    assert np.array_equal(from_disk.flat_parameters(), original.flat_parameters())
    assert np.array_equal(from_disk.flat_buffers(), original.flat_buffers())


def test_state_is_a_snapshot_not_a_view():
    spec = model_spec(*MLP)
    engine = torch_engine(spec)
    continue_training(engine, batches(2))
    snapshot = engine.state()
    frozen = {k: v.clone() for k, v in snapshot["model"].items()}
    continue_training(engine, batches(2, seed=3))
    assert all(torch.equal(frozen[k], snapshot["model"][k]) for k in frozen)
    first, second = torch_engine(spec), torch_engine(spec)
    first.load_state(snapshot)
    second.load_state(snapshot)
    after = batches(3, seed=4)
    assert continue_training(first, after) == continue_training(second, after)


def test_load_state_rejects_other_models_and_garbage():
    engine = torch_engine(model_spec(*MLP))
    other = torch_engine(model_spec(*MLP, model_id="mlp-001"))
    wider = torch_engine(model_spec("mlp", {"hidden": [33, 16]}))
    for bad, needle in [
        (other.state(), "cannot be loaded into model 'mlp-000'"),
        (wider.state(), "parameters"),
        ({"weights": 1}, "not a torch engine state"),
        ([1, 2], "not a torch engine state"),
    ]:
        with pytest.raises(UserError, match=needle):
            engine.load_state(bad)


def shard_average_step(replicas: list[TorchEngine], x: np.ndarray, y: np.ndarray) -> None:
    """One data-parallel step: each replica its equal shard, gradients averaged, applied everywhere."""
    m = len(replicas)
    for replica, xs, ys in zip(replicas, np.split(x, m), np.split(y, m)):
        replica.compute_gradients(xs, ys)
    average = sum(r.flat_gradients().copy() for r in replicas) / m
    for replica in replicas:
        replica.load_flat_gradients(average)
        replica.apply_gradients()


@pytest.mark.parametrize("m", [2, 4])
@pytest.mark.parametrize("family_params", [MLP, LSTM], ids=["mlp", "lstm"])
def test_data_parallel_shards_equal_one_big_batch(family_params, m):
    spec = model_spec(*family_params, lr=0.1, weight_decay=1e-3)
    reference = torch_engine(spec)
    replicas = [torch_engine(spec) for _ in range(m)]
    for x, y in batches(3, size=16):
        reference.train_step(x, y)
        shard_average_step(replicas, x, y)
    for replica in replicas:
        np.testing.assert_allclose(replica.flat_parameters(), reference.flat_parameters(), rtol=0, atol=1e-6)


def test_flat_gradients_is_a_view_of_the_gradients_on_cpu():
    engine = torch_engine(model_spec(*MLP))
    engine.compute_gradients(*batches(1)[0])
    flat = engine.flat_gradients()
    assert flat.dtype == np.float32 and flat.ndim == 1 and flat.flags.c_contiguous
    assert flat.size == engine.num_parameters
    first_weight = next(engine.net.parameters())
    assert np.array_equal(flat[: first_weight.numel()], first_weight.grad.reshape(-1).numpy())
    flat *= 0.5  # an in-place reduction reaches the parameters' .grad directly
    assert np.array_equal(flat[: first_weight.numel()], first_weight.grad.reshape(-1).numpy())
    engine.load_flat_gradients(flat)  # its own memory: a no-op
    buffer = engine.gradient_buffer()
    assert isinstance(buffer, torch.Tensor) and buffer.data_ptr() == flat.__array_interface__["data"][0]
    engine.scale_gradients(2.0)  # in place, on the buffer itself
    assert np.array_equal(flat[: first_weight.numel()], first_weight.grad.reshape(-1).numpy())
    assert engine.gradient_buffer() is buffer


def test_load_flat_gradients_checks_the_length():
    engine = torch_engine(model_spec(*MLP))
    with pytest.raises(ValueError, match="expected a 1-D array of"):
        engine.load_flat_gradients(np.zeros(3, dtype=np.float32))


def test_flat_parameters_and_buffers_round_trip():
    source = torch_engine(model_spec(*RESNET, seed=1))
    continue_training(source, batches(2))
    target = torch_engine(model_spec(*RESNET, seed=2))
    target.load_flat_parameters(source.flat_parameters())
    target.load_flat_buffers(source.flat_buffers())
    assert np.array_equal(target.flat_parameters(), source.flat_parameters())
    assert source.flat_buffers().size > 0
    x, y = batches(1, seed=9)[0]
    assert target.evaluate(x, y) == source.evaluate(x, y)


def test_evaluate_is_batch_size_independent_and_leaves_weights_alone():
    engine = torch_engine(model_spec(*RESNET))
    continue_training(engine, batches(2))
    x, y = batches(1, size=50, seed=5)[0]
    weights = engine.flat_parameters()
    whole, pieces = engine.evaluate(x, y), engine.evaluate(x, y, batch_size=7)
    assert set(whole) == {"loss", "accuracy"}
    assert whole["loss"] == pytest.approx(pieces["loss"], rel=1e-5)
    assert whole["accuracy"] == pieces["accuracy"]
    assert 0.0 <= whole["accuracy"] <= 1.0 and math.isclose(whole["accuracy"] * 50, round(whole["accuracy"] * 50))
    assert np.array_equal(weights, engine.flat_parameters())


def test_a_wrong_batch_shape_names_the_model():
    engine = torch_engine(model_spec(*MLP))
    with pytest.raises(ValueError, match="mlp-000.*expected x of shape"):
        engine.train_step(np.zeros((4, 3, 8, 8), np.float32), np.zeros(4, np.int64))


@pytest.mark.parametrize(
    ("schedule", "expected"),
    [
        ({"kind": "constant"}, [0.1] * 6),
        ({"kind": "constant", "warmup_epochs": 2}, [0.1 / 3, 0.2 / 3, 0.1, 0.1, 0.1, 0.1]),
        ({"kind": "step", "step_epochs": 2, "gamma": 0.5}, [0.1, 0.1, 0.05, 0.05, 0.025, 0.025]),
        ({"kind": "step", "step_epochs": 2, "gamma": 0.5, "warmup_epochs": 1}, [0.05, 0.1, 0.1, 0.05, 0.05, 0.025]),
        ({"kind": "cosine"}, [0.05 * (1 + math.cos(math.pi * e / 6)) for e in range(6)]),
        (
            {"kind": "cosine", "warmup_epochs": 2},
            [0.1 / 3, 0.2 / 3] + [0.05 * (1 + math.cos(math.pi * t / 4)) for t in range(4)],
        ),
    ],
    ids=["constant", "warmup", "step", "step-warmup", "cosine", "cosine-warmup"],
)
def test_lr_schedules_follow_their_formulas(schedule, expected):
    rule = LRSchedule(**schedule)
    assert [learning_rate(0.1, rule, e, 6) for e in range(6)] == pytest.approx(expected)
    engine = torch_engine(model_spec(*MLP, lr=0.1, max_epochs=6, schedule=schedule))
    seen = []
    for _ in range(6):
        seen.append(engine.lr)
        engine.end_epoch()
    assert seen == pytest.approx(expected)
    assert engine.epoch == 6


def test_cosine_ends_at_zero_and_stays_there():
    rule = LRSchedule(kind="cosine")
    assert learning_rate(0.1, rule, 10, 10) == pytest.approx(0.0)
    assert learning_rate(0.1, rule, 14, 10) == pytest.approx(0.0)


def separable_blobs(count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """CLASSES Gaussian blobs around fixed random centres in 8x8 image space."""
    centres = np.random.default_rng(123).standard_normal((CLASSES, *MNIST_LIKE)).astype(np.float32)
    rng = np.random.default_rng(seed)
    y = rng.integers(0, CLASSES, count)
    x = centres[y] + 0.7 * rng.standard_normal((count, *MNIST_LIKE)).astype(np.float32)
    return x.astype(np.float32), y


def test_an_mlp_learns_separable_data():
    engine = torch_engine(model_spec("mlp", {"hidden": [32]}, lr=0.05))
    x, y = separable_blobs(2048, seed=1)
    for step in range(200):
        i = (step * 32) % 2048
        engine.train_step(x[i : i + 32], y[i : i + 32])
    held_out = engine.evaluate(*separable_blobs(500, seed=2))
    assert held_out["accuracy"] > 0.9


def test_threads_sets_torch_threads():
    before = torch.get_num_threads()
    try:
        torch_engine(model_spec(*MLP), threads=1)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("device", ["tpu:0", "not a device"])
def test_bad_devices_are_user_errors(device):
    with pytest.raises(UserError, match="device"):
        torch_engine(model_spec(*MLP), device=device)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this node has CUDA")
def test_cuda_without_cuda_is_a_user_error():
    with pytest.raises(UserError, match="CUDA is not available"):
        torch_engine(model_spec(*MLP), device="cuda:0")


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@needs_cuda
@pytest.mark.parametrize("family_params", [CNN, LSTM, RESNET], ids=["cnn", "lstm", "resnet"])
def test_cuda_engine_trains_and_moves_to_cpu(family_params):
    spec = model_spec(*family_params, optimizer="adam", lr=0.01)
    gpu = torch_engine(spec, device="cuda:0", deterministic=True)
    cpu = torch_engine(spec)
    assert np.array_equal(gpu.flat_parameters(), cpu.flat_parameters())  # same init on any device
    losses = continue_training(gpu, batches(3))
    assert all(math.isfinite(v) for v in losses)
    grads = gpu.flat_gradients()
    assert grads.dtype == np.float32 and grads.size == gpu.num_parameters
    assert gpu.gradient_buffer().device == torch.device("cuda:0")
    cpu.load_state_bytes(gpu.state_bytes())
    np.testing.assert_array_equal(cpu.flat_parameters(), gpu.flat_parameters())
    x, y = batches(1, seed=8)[0]
    assert cpu.evaluate(x, y)["loss"] == pytest.approx(gpu.evaluate(x, y)["loss"], rel=1e-4)


@needs_cuda
def test_cuda_data_parallel_shards_equal_one_big_batch():
    spec = model_spec(*MLP, lr=0.1)
    reference = torch_engine(spec, device="cuda:0", deterministic=True)
    replicas = [torch_engine(spec, device="cuda:0", deterministic=True) for _ in range(2)]
    for x, y in batches(3, size=16):
        reference.train_step(x, y)
        shard_average_step(replicas, x, y)
    for replica in replicas:
        np.testing.assert_allclose(replica.flat_parameters(), reference.flat_parameters(), rtol=0, atol=1e-5)


USER_DROPOUT_MODULE = """
from torch import nn

def dropout_mlp(input_shape, num_classes, p=0.5):
    c, h, w = input_shape
    return nn.Sequential(nn.Flatten(), nn.Linear(c * h * w, 16), nn.Dropout(p), nn.Linear(16, num_classes))
"""


def test_a_user_model_on_the_global_rng_resumes_exactly(tmp_path, monkeypatch):
    (tmp_path / "fleet_engine_user_models.py").write_text(USER_DROPOUT_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = model_spec("fleet_engine_user_models:dropout_mlp", {"p": 0.4}, model_id="user-000")
    original = torch_engine(spec)
    continue_training(original, batches(2, seed=1))
    snapshot = original.state()
    after = batches(3, seed=2)
    expected = continue_training(original, after)
    resumed = torch_engine(spec)
    resumed.load_state(snapshot)
    assert continue_training(resumed, after) == expected


@needs_cuda
def test_cuda_state_resumes_exactly():
    spec = model_spec(*CNN, optimizer="adam", lr=0.01)
    before, after = batches(3, seed=1), batches(3, seed=2)
    original = torch_engine(spec, device="cuda:0", deterministic=True)
    continue_training(original, before)
    snapshot = original.state()
    expected = continue_training(original, after)
    resumed = torch_engine(spec, device="cuda:0", deterministic=True)
    resumed.load_state(snapshot)
    assert continue_training(resumed, after) == expected
