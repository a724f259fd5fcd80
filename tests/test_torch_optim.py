"""`ParamUpdate`, the torch engine's own optimizer step: torch.optim's arithmetic and state
layout (whole trainings against torch.optim: tests/test_engine_parity.py), without loading
torch's compiler."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from fleet.engines.torch.optim import ParamUpdate, update_chunks
from fleet.spec import TrainSpec

TRAININGS = {
    "sgd-momentum": {"optimizer": "sgd", "lr": 0.05, "momentum": 0.9, "weight_decay": 5e-4},
    "sgd-plain": {"optimizer": "sgd", "lr": 0.1, "momentum": 0.0},
    "adam": {"optimizer": "adam", "lr": 0.01, "weight_decay": 1e-4},
    "adamw": {"optimizer": "adamw", "lr": 0.01, "weight_decay": 0.01},
}


def torch_optimizer(params, train: TrainSpec) -> torch.optim.Optimizer:
    if train.optimizer.value == "sgd":
        return torch.optim.SGD(params, lr=train.lr, momentum=train.momentum, weight_decay=train.weight_decay)
    kind = torch.optim.Adam if train.optimizer.value == "adam" else torch.optim.AdamW
    return kind(params, lr=train.lr, weight_decay=train.weight_decay)


def tensors(seed: int = 0) -> list[torch.nn.Parameter]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(shape, generator=generator)) for shape in [(5, 3), (3,), (2, 2, 2)]]


def step(optimizer, params, k: int) -> None:
    """`k` steps on fixed pseudo-random gradients (the same for both optimizers)."""
    for i in range(k):
        generator = torch.Generator().manual_seed(100 + i)
        for p in params:
            p.grad = torch.randn(p.shape, generator=generator)
        optimizer.step()


@pytest.mark.parametrize("train", TRAININGS.values(), ids=TRAININGS.keys())
def test_a_torch_optim_state_loads_and_trains_on_as_torch_optim(train):
    """Checkpoints written while the engine stepped with torch.optim resume with `ParamUpdate`."""
    spec = TrainSpec(**train)
    reference = tensors()
    optimizer = torch_optimizer(reference, spec)
    step(optimizer, reference, 3)
    saved = optimizer.state_dict()

    ours = [torch.nn.Parameter(p.detach().clone()) for p in reference]
    update = ParamUpdate(ours, spec)
    update.load_state_dict(saved)
    step(optimizer, reference, 4)
    step(update, ours, 4)
    for a, b in zip(ours, reference):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


@pytest.mark.parametrize("train", TRAININGS.values(), ids=TRAININGS.keys())
def test_its_own_state_resumes_exactly(train):
    spec = TrainSpec(**train)
    first = tensors()
    update = ParamUpdate(first, spec)
    step(update, first, 2)
    second = [torch.nn.Parameter(p.detach().clone()) for p in first]
    resumed = ParamUpdate(second, spec)
    resumed.load_state_dict(update.state_dict())
    step(update, first, 3)
    step(resumed, second, 3)
    assert all(torch.equal(a, b) for a, b in zip(first, second))


def test_a_state_of_another_network_or_optimizer_is_refused():
    spec = TrainSpec(optimizer="adam", lr=0.01)
    trained = tensors()
    update = ParamUpdate(trained, spec)
    step(update, trained, 1)
    state = update.state_dict()

    fewer = ParamUpdate(tensors()[:2], spec)
    with pytest.raises(ValueError, match="for 3 parameter tensors, the network has 2"):
        fewer.load_state_dict(state)
    other_shapes = [torch.nn.Parameter(torch.zeros(s)) for s in [(5, 3), (4,), (2, 2, 2)]]
    with pytest.raises(ValueError, match="parameter tensor 1 does not fit its shape"):
        ParamUpdate(other_shapes, spec).load_state_dict(state)
    sgd = torch.optim.SGD(tensors(), lr=0.1, momentum=0.9)
    step(sgd, sgd.param_groups[0]["params"], 1)
    with pytest.raises(ValueError, match="holds momentum_buffer: another optimizer.s state than adam.s"):
        ParamUpdate(tensors(), spec).load_state_dict(sgd.state_dict())


def test_training_never_loads_the_torch_compiler():
    """torch.optim imports torch._dynamo in its constructor and every step (2.4 s of CPU per
    trainer process); the engine trains, evaluates and checkpoints without it."""
    code = textwrap.dedent("""
        import sys
        import numpy as np
        from fleet.engines import EngineOptions
        from fleet.engines.torch import TorchEngine
        from fleet.spec import ModelSpec, TrainSpec
        for optimizer in ("sgd", "adam", "adamw"):
            spec = ModelSpec(id="m", family="cnn", params={"channels": [4, 8]}, seed=1,
                             train=TrainSpec(optimizer=optimizer, lr=0.01, weight_decay=1e-4))
            engine = TorchEngine(EngineOptions(spec, (3, 8, 8), 4))
            x = np.random.default_rng(0).standard_normal((16, 3, 8, 8)).astype(np.float32)
            y = np.arange(16) % 4
            for _ in range(2):
                engine.train_step(x, y)
            engine.evaluate(x, y)
            engine.end_epoch()
            TorchEngine(EngineOptions(spec, (3, 8, 8), 4)).load_state_bytes(engine.state_bytes())
        print(sorted(m for m in sys.modules if m.startswith("torch._dynamo")))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


def test_cpu_updates_go_in_cache_sized_runs_of_tensors_and_gpu_ones_all_at_once():
    sizes = [10, 20, 100, 5, 5, 3, 200]
    assert update_chunks(sizes, one=False, elements=40) == [(0, 2), (2, 3), (3, 6), (6, 7)]
    assert update_chunks(sizes, one=True, elements=40) == [(0, 7)]
    assert update_chunks([], one=False) == []
