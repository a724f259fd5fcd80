"""The torch engine against a plain PyTorch loop on the same batches (`bench/parity.py` compares
whole runs): the same weights after several epochs for every optimizer and LR schedule, and the
same validation metrics in eval mode."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fleet.engines import EngineOptions
from fleet.engines.torch import TorchEngine
from fleet.engines.torch.zoo import build_model
from fleet.spec import ModelSpec, TrainSpec

SHAPE = (1, 8, 8)
CLASSES = 4
EPOCHS = 4


def epoch_batches(epoch: int, sizes=(16, 16, 16, 5)) -> list[tuple[np.ndarray, np.ndarray]]:
    """One epoch's batches (the last one short, as fleet's and a DataLoader's can be)."""
    rng = np.random.default_rng(100 + epoch)
    return [(rng.standard_normal((n, *SHAPE)).astype(np.float32), rng.integers(0, CLASSES, n)) for n in sizes]


def torch_optimizer(net: torch.nn.Module, train: TrainSpec) -> torch.optim.Optimizer:
    name = train.optimizer.value
    if name == "sgd":
        return torch.optim.SGD(net.parameters(), lr=train.lr, momentum=train.momentum, weight_decay=train.weight_decay)
    kind = torch.optim.Adam if name == "adam" else torch.optim.AdamW
    return kind(net.parameters(), lr=train.lr, weight_decay=train.weight_decay)


def torch_scheduler(optimizer: torch.optim.Optimizer, train: TrainSpec):
    """torch's schedulers, stepped once per epoch, as a user writes them."""
    schedule, sched = train.schedule, torch.optim.lr_scheduler
    w = schedule.warmup_epochs
    if schedule.kind.value == "cosine":
        after = sched.CosineAnnealingLR(optimizer, T_max=train.max_epochs - w)
    elif schedule.kind.value == "step":
        after = sched.StepLR(optimizer, step_size=schedule.step_epochs, gamma=schedule.gamma)
    else:
        after = sched.LambdaLR(optimizer, lambda epoch: 1.0)
    if not w:
        return after
    warm = sched.LinearLR(optimizer, start_factor=1 / (w + 1), end_factor=1.0, total_iters=w)
    return sched.SequentialLR(optimizer, [warm, after], milestones=[w])


def plain_run(spec: ModelSpec) -> tuple[torch.nn.Module, list[float]]:
    net = build_model(spec.family, spec.params, SHAPE, CLASSES, seed=spec.seed)
    optimizer = torch_optimizer(net, spec.train)
    scheduler = torch_scheduler(optimizer, spec.train)
    lrs = []
    for epoch in range(EPOCHS):
        lrs.append(optimizer.param_groups[0]["lr"])
        net.train()
        for x, y in epoch_batches(epoch):
            optimizer.zero_grad()
            F.cross_entropy(net(torch.from_numpy(x)), torch.from_numpy(y)).backward()
            optimizer.step()
        scheduler.step()
    return net, lrs


def engine_run(spec: ModelSpec) -> tuple[TorchEngine, list[float]]:
    engine = TorchEngine(EngineOptions(spec, SHAPE, CLASSES))
    lrs = []
    for epoch in range(EPOCHS):
        lrs.append(engine.lr)
        for x, y in epoch_batches(epoch):
            engine.train_step(x, y)
        engine.end_epoch()
    return engine, lrs


TRAININGS = {
    "sgd-momentum-cosine": {"optimizer": "sgd", "lr": 0.05, "momentum": 0.9, "weight_decay": 5e-4,
                            "schedule": "cosine"},
    "sgd-plain-constant": {"optimizer": "sgd", "lr": 0.1, "momentum": 0.0, "weight_decay": 0.0},
    "sgd-step-warmup": {"optimizer": "sgd", "lr": 0.05, "schedule": {"kind": "step", "step_epochs": 2, "gamma": 0.3,
                                                                     "warmup_epochs": 1}},
    "adam-cosine-warmup": {"optimizer": "adam", "lr": 0.002, "weight_decay": 1e-4,
                           "schedule": {"kind": "cosine", "warmup_epochs": 1}},
    "adamw-step": {"optimizer": "adamw", "lr": 0.002, "weight_decay": 0.01,
                   "schedule": {"kind": "step", "step_epochs": 1, "gamma": 0.5}},
}
FAMILIES = {
    "cnn-bn": ("cnn", {"channels": [4, 8], "hidden": 16}),
    "resnet": ("resnet", {"blocks": [1, 1, 1, 1], "width": 4}),
    "mlp": ("mlp", {"hidden": [32]}),
}


@pytest.mark.parametrize("family", FAMILIES.values(), ids=FAMILIES.keys())
@pytest.mark.parametrize("train", TRAININGS.values(), ids=TRAININGS.keys())
def test_the_engine_trains_as_a_plain_loop(family, train):
    spec = ModelSpec(id="m", family=family[0], params=family[1], seed=3,
                     train=TrainSpec(max_epochs=EPOCHS, batch_size=16, **train))
    net, plain_lrs = plain_run(spec)
    engine, engine_lrs = engine_run(spec)
    assert engine_lrs == pytest.approx(plain_lrs, rel=1e-9)
    reference = torch.cat([p.detach().flatten() for p in net.parameters()]).numpy()
    np.testing.assert_allclose(engine.flat_parameters(), reference, rtol=0, atol=2e-5)
    buffers = torch.cat([b.flatten().float() for b in net.buffers() if b.is_floating_point()] or [torch.zeros(0)])
    np.testing.assert_allclose(engine.flat_buffers(), buffers.numpy(), rtol=0, atol=2e-5)


def same_trained_cnn() -> tuple[torch.nn.Module, TorchEngine]:
    """A CNN with dropout trained by the plain loop, and an engine holding its weights."""
    spec = ModelSpec(id="m", family="cnn", params={"channels": [4, 8], "hidden": 16, "dropout": 0.5}, seed=3,
                     train=TrainSpec(max_epochs=EPOCHS))
    net, _ = plain_run(spec)
    engine, _ = engine_run(spec)
    engine.load_flat_parameters(torch.cat([p.detach().flatten() for p in net.parameters()]).numpy())
    engine.load_flat_buffers(torch.cat([b.flatten() for b in net.buffers() if b.is_floating_point()]).numpy())
    return net, engine


def test_evaluation_is_a_plain_eval_mode_pass_without_dropout():
    net, engine = same_trained_cnn()
    x, y = epoch_batches(99, sizes=(300,))[0]
    net.eval()
    with torch.no_grad():
        logits = net(torch.from_numpy(x))
    expected_loss = float(F.cross_entropy(logits, torch.from_numpy(y)))
    expected_accuracy = float((logits.argmax(1).numpy() == y).mean())
    first, second = engine.evaluate(x, y, batch_size=64), engine.evaluate(x, y, batch_size=300)
    assert first == pytest.approx(second)
    assert first == pytest.approx({"loss": expected_loss, "accuracy": expected_accuracy})


def test_the_probabilities_kept_are_the_evaluation_passs_softmax_and_predict_gives_the_same():
    net, engine = same_trained_cnn()
    x, y = epoch_batches(98, sizes=(150,))[0]
    net.eval()
    with torch.no_grad():
        expected = torch.softmax(net(torch.from_numpy(x)), dim=1).numpy()
    metrics, probabilities = engine.evaluate_with_probabilities(x, y, batch_size=64)
    assert metrics == engine.evaluate(x, y, batch_size=64)
    assert probabilities.dtype == np.float32 and probabilities.shape == (150, CLASSES)
    np.testing.assert_allclose(probabilities, expected, atol=1e-6)
    np.testing.assert_allclose(engine.predict(x, batch_size=32), probabilities, atol=1e-6)
    with pytest.raises(ValueError, match="expected x of shape"):
        engine.predict(x[:, :, :4])
