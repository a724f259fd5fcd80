"""The model zoo: shapes, parameter and FLOP counts, user families and their errors."""

from __future__ import annotations

import signal
import sys
import textwrap

import numpy as np
import pytest
import torch
from torch import nn

from fleet import interrupts
from fleet.engines import EngineOptions
from fleet.engines.factory import create_engine
from fleet.errors import UserCodeError, UserError
from fleet.engines.torch.zoo import build_model, describe
from fleet.spec import parse_spec

FAMILY_CASES = [
    ("resnet", {"blocks": [1, 1, 1, 1], "width": 4}),
    ("resnet", {"blocks": [1, 2, 1, 1], "width": 2, "bottleneck": True}),
    ("densenet", {"blocks": [2, 2, 2], "growth_rate": 4}),
    ("densenet", {"blocks": [1, 1, 1, 1], "growth_rate": 4, "init_features": 6, "compression": 1.0}),
    ("cnn", {"channels": [4, 8]}),
    ("cnn", {"channels": [4, 4, 4, 4, 4], "hidden": 0, "kernel_size": 5, "dropout": 0.5}),
    ("mlp", {"hidden": [16, 8], "dropout": 0.1}),
    ("mlp", {"hidden": []}),
    ("lstm", {"hidden": 8}),
    ("lstm", {"hidden": 8, "layers": 2, "bidirectional": True}),
]
SHAPES = [(1, 8, 8), (3, 16, 16), (3, 32, 32)]


def case_id(case: tuple[str, dict]) -> str:
    return case[0] + "-" + "-".join(f"{k}={v}" for k, v in case[1].items())


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("case", FAMILY_CASES, ids=case_id)
def test_every_family_maps_a_batch_to_logits(case, shape):
    family, params = case
    model = build_model(family, params, shape, 7, seed=0)
    out = model(torch.randn(2, *shape))
    assert out.shape == (2, 7)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("case", FAMILY_CASES[::2], ids=case_id)
@pytest.mark.parametrize("shape", [(3, 9, 13), (1, 8, 64), (1, 2, 1)], ids=lambda s: "x".join(map(str, s)))
def test_odd_and_tiny_maps_work(case, shape):
    family, params = case
    out = build_model(family, params, shape, 3, seed=0).eval()(torch.randn(1, *shape))
    assert out.shape == (1, 3)


def test_defaults_fill_missing_params():
    model = build_model("densenet", {}, (3, 16, 16), 10, seed=0)
    stem = model.features[0]
    assert stem.out_channels == 2 * 12  # init_features defaults to 2 x growth_rate


def conv_strides(model: nn.Module) -> list[tuple[int, int]]:
    return [m.stride for m in model.modules() if isinstance(m, nn.Conv2d) and m.kernel_size == (3, 3)]


def test_resnet_stops_striding_at_one_pixel():
    model = build_model("resnet", {"blocks": [1, 1, 1, 1], "width": 2}, (1, 4, 4), 2, seed=0)
    # stem, then the first conv of each stage: 4 -> 4 -> 2 -> 1 -> 1 (no stride left)
    first_convs = [s[0].body[0][0].stride for s in model.stages]
    assert first_convs == [(1, 1), (2, 2), (2, 2), (1, 1)]


def test_densenet_skips_pooling_at_one_pixel():
    model = build_model("densenet", {"blocks": [1, 1, 1, 1], "growth_rate": 2}, (1, 2, 2), 2, seed=0)
    pools = [m for m in model.modules() if isinstance(m, nn.AvgPool2d)]
    assert len(pools) == 1
    assert model.eval()(torch.randn(1, 1, 2, 2)).shape == (1, 2)


def test_densenet_transition_compresses_channels():
    model = build_model("densenet", {"blocks": [2, 2], "growth_rate": 4, "init_features": 8}, (1, 8, 8), 2, seed=0)
    transition_conv = model.features[2][2]
    assert transition_conv.in_channels == 8 + 2 * 4
    assert transition_conv.out_channels == 8  # floor(0.5 * 16)


def test_cnn_pools_only_while_the_map_allows():
    model = build_model("cnn", {"channels": [2] * 5, "hidden": 0}, (1, 8, 8), 2, seed=0)
    assert sum(isinstance(m, nn.MaxPool2d) for m in model.modules()) == 3  # 8 -> 4 -> 2 -> 1
    assert model.classifier[0].in_features == 2


def test_tiny_mlp_parameters_and_flops_match_hand_counts():
    stats = describe("mlp", {"hidden": [10]}, (1, 8, 8), 3)
    assert stats.parameters == (64 * 10 + 10) + (10 * 3 + 3)
    assert stats.param_bytes == 4 * stats.parameters
    assert stats.flops_per_sample == 2 * (64 * 10 + 10 * 3)


def test_tiny_cnn_parameters_and_flops_match_hand_counts():
    stats = describe("cnn", {"channels": [4], "hidden": 0}, (1, 8, 8), 2)
    conv, bn, head = 1 * 4 * 3 * 3, 2 * 4, (4 * 4 * 4) * 2 + 2
    assert stats.parameters == conv + bn + head
    conv_macs = (4 * 8 * 8) * (1 * 3 * 3)
    assert stats.flops_per_sample == 2 * (conv_macs + 64 * 2)


def test_lstm_flops_count_four_gates_per_step():
    stats = describe("lstm", {"hidden": 5}, (1, 4, 4), 2)
    steps, per_step = 4, 4 * 5 * (4 + 5)
    assert stats.flops_per_sample == 2 * (steps * per_step + 5 * 2)


def test_describe_leaves_the_global_rng_alone():
    before = torch.get_rng_state()
    describe("resnet", {"blocks": [1, 1, 1, 1], "width": 2}, (1, 8, 8), 2)
    assert torch.equal(before, torch.get_rng_state())


@pytest.mark.parametrize("family", ["resnet", "densenet", "cnn", "mlp", "lstm"])
def test_a_model_too_large_for_the_cpu_is_counted_alike_on_the_meta_device(monkeypatch, family):
    """Zoo models are counted on the CPU up to COUNT_ON_CPU_BYTES, beyond it on torch's meta
    device (nothing allocated): both give the same figures."""
    import fleet.engines.torch.zoo as zoo

    on_cpu = describe(family, {}, (3, 16, 16), 10)
    monkeypatch.setattr(zoo, "COUNT_ON_CPU_BYTES", 0)
    assert describe(family, {}, (3, 16, 16), 10) == on_cpu


def test_counting_the_zoo_does_not_load_torchs_compiler_stack():
    """A fresh process counts every zoo family without importing dynamo or sympy (on the meta
    device a normal_ or a batch norm would: 1.2 s on every `fleet validate` and rank 0)."""
    import subprocess

    code = ("import sys; from fleet.engines.torch.zoo import describe, parameter_bytes\n"
            "for f in ('resnet', 'densenet', 'cnn', 'mlp', 'lstm'):\n"
            "    describe(f, {}, (3, 16, 16), 10); parameter_bytes(f, {}, (3, 16, 16), 10)\n"
            "print(sorted(m for m in sys.modules if m.startswith(('torch._dynamo', 'sympy')))[:3])\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]", done.stdout


def test_same_seed_same_weights_other_seed_other_weights():
    def weights(seed: int) -> torch.Tensor:
        model = build_model("cnn", {"channels": [4]}, (1, 8, 8), 2, seed=seed)
        return torch.cat([p.detach().reshape(-1) for p in model.parameters()])

    assert torch.equal(weights(1), weights(1))
    assert not torch.equal(weights(1), weights(2))


@pytest.mark.parametrize(
    ("family", "params", "needle"),
    [
        ("transformer", {}, "unknown family 'transformer'"),
        ("resnet", {"blocks": [1, 1]}, "params.blocks"),
        ("mlp", {"hiden": [3]}, "unknown key"),
        ("cnn", {"kernel_size": 4}, "odd kernel"),
    ],
)
def test_zoo_errors_are_one_line_user_errors(family, params, needle):
    with pytest.raises(UserError) as info:
        build_model(family, params, (1, 8, 8), 2)
    assert needle in str(info.value)
    assert "\n" not in str(info.value)


USER_MODULE = '''
import torch
from torch import nn

def tiny(input_shape, num_classes, hidden=4):
    c, h, w = input_shape
    return nn.Sequential(nn.Flatten(), nn.Linear(c * h * w, hidden), nn.ReLU(), nn.Linear(hidden, num_classes))

def strict(input_shape, num_classes, width):
    if width < 1:
        raise ValueError("width must be positive")
    return nn.Linear(1, 1)

def not_a_module(input_shape, num_classes):
    return [1, 2, 3]

NOT_CALLABLE = 42

def crashes(input_shape, num_classes):
    raise RuntimeError("no GPU in this process")

def exits(input_shape, num_classes):
    raise SystemExit(0)

def interrupts(input_shape, num_classes):
    raise KeyboardInterrupt

def pressed(input_shape, num_classes):
    import signal
    signal.raise_signal(signal.SIGINT)

class Quitter(nn.Module):
    def __init__(self, input_shape, num_classes, how):
        super().__init__()
        self.linear = nn.Linear(input_shape[0] * input_shape[1] * input_shape[2], num_classes)
        self.how = how

    def forward(self, x):
        if self.how == "exit":
            raise SystemExit(0)
        if self.how == "interrupt":
            raise KeyboardInterrupt
        if self.how == "zero":
            return 1 / 0
        return self.linear(x.flatten(1))[:, :1]

def quitter(input_shape, num_classes, how):
    return Quitter(input_shape, num_classes, how)
'''


@pytest.fixture
def user_modules(tmp_path, monkeypatch):
    """Two importable modules: `fleet_user_models_ok` and `fleet_user_models_broken`."""
    (tmp_path / "fleet_user_models_ok.py").write_text(textwrap.dedent(USER_MODULE))
    (tmp_path / "fleet_user_models_broken.py").write_text("import no_such_package_for_fleet_tests\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "fleet_user_models_ok"
    for name in ("fleet_user_models_ok", "fleet_user_models_broken"):
        sys.modules.pop(name, None)


def test_user_family_builds_and_gets_params(user_modules):
    model = build_model(f"{user_modules}:tiny", {"hidden": 6}, (1, 8, 8), 3, seed=0)
    assert model(torch.randn(2, 1, 8, 8)).shape == (2, 3)
    assert model[1].out_features == 6
    assert describe(f"{user_modules}:tiny", {}, (1, 8, 8), 3).parameters == (64 * 4 + 4) + (4 * 3 + 3)


@pytest.mark.parametrize(
    ("family", "params", "needle"),
    [
        ("fleet_user_models_missing:f", {}, "cannot import 'fleet_user_models_missing'"),
        ("fleet_user_models_broken:f", {}, "No module named 'no_such_package_for_fleet_tests'"),
        ("fleet_user_models_ok:nowhere", {}, "has no attribute 'nowhere'"),
        ("fleet_user_models_ok:NOT_CALLABLE", {}, "is a int, not a function"),
        ("fleet_user_models_ok:not_a_module", {}, "returned a list, expected a torch.nn.Module"),
        ("fleet_user_models_ok:tiny", {"depth": 3}, "bad params {'depth': 3}: TypeError"),
        ("fleet_user_models_ok:strict", {}, "TypeError"),
        ("fleet_user_models_ok:strict", {"width": 0}, "ValueError: width must be positive"),
        ("fleet_user_models_ok:crashes", {}, "the builder raised RuntimeError: no GPU in this process"),
        ("fleet_user_models_ok:exits", {}, "the builder called sys.exit(0)"),
        ("fleet_user_models_ok:interrupts", {}, "the builder raised KeyboardInterrupt (its own code, not a Ctrl-C)"),
    ],
)
def test_user_family_errors_are_one_line_user_errors(user_modules, sigint_noted, family, params, needle):
    with pytest.raises(UserError) as info:
        build_model(family, params, (1, 8, 8), 3)
    message = str(info.value)
    assert message.startswith(f"family {family!r}: ")
    assert needle in message
    assert "\n" not in message


@pytest.fixture
def sigint_noted():
    """The CLI's SIGINT handler (`fleet.interrupts`), restored to the test runner's afterwards."""
    before = signal.getsignal(signal.SIGINT)
    interrupts.install()
    yield
    signal.signal(signal.SIGINT, before)


def test_a_ctrl_c_in_user_code_still_interrupts(user_modules, sigint_noted):
    with pytest.raises(KeyboardInterrupt):
        build_model(f"{user_modules}:pressed", {}, (1, 8, 8), 3)


@pytest.mark.parametrize(
    ("how", "needle"),
    [
        ("exit", "forward called sys.exit(0)"),
        ("interrupt", "forward raised KeyboardInterrupt (its own code, not a Ctrl-C)"),
        ("zero", "forward raised ZeroDivisionError: division by zero"),
        ("shape", "forward returned shape (2, 1) for a batch of 2, expected (2, 3) (batch, num_classes)"),
    ],
)
def test_describe_runs_a_user_model_once_and_names_what_its_code_did(user_modules, sigint_noted, how, needle):
    with pytest.raises(UserCodeError) as info:
        describe(f"{user_modules}:quitter", {"how": how}, (1, 8, 8), 3)
    assert info.value.problem == needle


@pytest.mark.parametrize("how", ["exit", "interrupt"])
def test_a_user_forward_that_exits_while_training_is_an_error_not_an_exit(user_modules, sigint_noted, how):
    """Under `fleet train` a rank whose model called sys.exit used to leave quietly, and the
    other ranks waited for it until runtime.timeout_s."""
    spec = parse_spec({"name": "t", "data": {"source": "digits"},
                       "models": [{"family": f"{user_modules}:quitter", "params": {"how": how}}]})
    engine = create_engine(EngineOptions(spec.models[0], (1, 8, 8), 10))
    with pytest.raises(UserCodeError, match="forward"):
        engine.compute_gradients(np.zeros((4, 1, 8, 8), np.float32), np.zeros(4, np.int64))
    assert list(engine.net.state_dict()) == ["linear.weight", "linear.bias"]  # the guard leaves no trace
