"""Frameworks by name: the registry, the spec's ``framework``, engines built through it, and the
torch framework's zoo and device answers. A second framework is one module plus one entry."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from fleet.engines import FRAMEWORKS, EngineOptions, Framework, ModelStats, framework_names, get_framework
from fleet.engines.factory import create_engine
from fleet.engines.torch import FRAMEWORK as TORCH, TorchEngine
from fleet.errors import UserError
from fleet.engines.torch.zoo import describe
from fleet.registry import Registry
from fleet.spec import SpecError, parse_spec

REPO = Path(__file__).resolve().parent.parent

FAKE_FRAMEWORK = '''
from fleet.engines.torch.framework import TorchFramework

class FakeFramework(TorchFramework):
    """torch under another name, recording what it was asked to build."""
    name = "fake"
    built = []

    def create_engine(self, options):
        self.built.append((options.model.id, options.device))
        return super().create_engine(options)

FRAMEWORK = FakeFramework()
'''


@pytest.fixture
def fake_framework(tmp_path, monkeypatch):
    """A second framework, ``fake``: one module and one registry entry."""
    (tmp_path / "fleet_fake_framework.py").write_text(FAKE_FRAMEWORK)
    monkeypatch.syspath_prepend(str(tmp_path))
    FRAMEWORKS.add("fake", "fleet_fake_framework:FRAMEWORK")
    yield
    FRAMEWORKS.remove("fake")
    sys.modules.pop("fleet_fake_framework", None)


def doc(**overrides) -> dict:
    base = {"name": "t", "data": {"source": "digits"}, "models": [{"family": "mlp", "params": {"hidden": [8]}}]}
    return {**base, **overrides}


# -- the registry ---------------------------------------------------------------------------


def test_a_registry_lists_names_without_importing_and_loads_once(tmp_path, monkeypatch):
    (tmp_path / "fleet_registry_probe.py").write_text("LOADS = []\nLOADS.append(1)\nTHING = object()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    registry: Registry[object] = Registry("widget", {"probe": "fleet_registry_probe:THING"})
    assert registry.names == ("probe",) and "probe" in registry and "fleet_registry_probe" not in sys.modules
    first = registry.load("probe")
    assert registry.load("probe") is first and sys.modules["fleet_registry_probe"].LOADS == [1]
    assert registry.unknown("gadget") == "unknown widget 'gadget' (valid: probe)"
    with pytest.raises(UserError, match=r"^unknown widget 'gadget' \(valid: probe\)$"):
        registry.load("gadget")
    with pytest.raises(ValueError, match="already registered"):
        registry.add("probe", "elsewhere:THING")
    with pytest.raises(ValueError, match="expected 'package.module:attribute'"):
        registry.add("broken", "no_colon")
    registry.remove("probe")
    assert registry.names == ()


def test_the_registered_frameworks_are_framework_objects():
    assert framework_names() == ("torch", "tensorflow")
    assert isinstance(get_framework("torch"), Framework) and get_framework("torch") is TORCH
    assert TORCH.name == "torch"
    with pytest.raises(UserError, match=r"^unknown framework 'jax' \(valid: torch, tensorflow\)$"):
        get_framework("jax")


def test_a_framework_that_is_not_installed_is_a_user_error_naming_it():
    FRAMEWORKS.add("absent", "fleet_no_such_framework_package:FRAMEWORK")
    try:
        with pytest.raises(UserError, match=r"^framework 'absent': cannot import it here \(No module named"):
            get_framework("absent")
    finally:
        FRAMEWORKS.remove("absent")


def test_importing_the_spec_and_the_engines_registry_imports_no_framework():
    script = ("import sys, fleet.spec, fleet.engines, fleet.engines.registry, fleet.engines.factory; "
              "fleet.spec.parse_spec({'name': 'x', 'data': {'source': 'digits'}, 'models': [{'family': 'mlp'}]}); "
              "print('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


# -- the spec's framework -------------------------------------------------------------------


def test_the_framework_defaults_to_torch_for_every_model():
    spec = parse_spec(doc())
    assert spec.framework == "torch" and [m.framework for m in spec.models] == ["torch"]


def test_a_model_overrides_the_ensembles_framework(fake_framework):
    models = [{"family": "mlp", "name": "a"}, {"family": "mlp", "name": "b", "framework": "torch"}]
    spec = parse_spec(doc(framework="fake", models=models))
    assert spec.framework == "fake"
    assert {m.id: m.framework for m in spec.models} == {"a": "fake", "b": "torch"}
    assert parse_spec(yaml.safe_load(spec.to_yaml())) == spec  # the resolved spec keeps both


@pytest.mark.parametrize(("overrides", "message"), [
    ({"framework": "jax"}, "framework: unknown framework 'jax' (valid: torch, tensorflow)"),
    ({"models": [{"family": "mlp"}, {"family": "cnn", "framework": "jax"}]},
     "models[1].framework: unknown framework 'jax' (valid: torch, tensorflow)"),
])
def test_an_unknown_framework_is_one_line_naming_the_field_and_the_valid_names(overrides, message):
    with pytest.raises(SpecError) as caught:
        parse_spec(doc(**overrides))
    assert str(caught.value) == message


def test_a_registered_framework_becomes_valid_in_the_spec(fake_framework):
    assert parse_spec(doc(framework="fake")).models[0].framework == "fake"


# -- engines through the registry -----------------------------------------------------------


def test_create_engine_builds_the_models_framework_engine(fake_framework):
    spec = parse_spec(doc(models=[{"family": "mlp", "name": "a", "framework": "fake", "params": {"hidden": [8]}},
                                  {"family": "mlp", "name": "b", "params": {"hidden": [8]}}]))
    fake = get_framework("fake")
    engines = [create_engine(EngineOptions(m, (1, 8, 8), 10)) for m in spec.models]
    assert fake.built == [("a", "cpu")]  # only the model that names it
    assert all(isinstance(e, TorchEngine) for e in engines)


# -- the torch framework's zoo and devices --------------------------------------------------


def test_the_torch_zoo_counts_like_the_model_zoo():
    params = {"channels": [4, 8], "hidden": 16}
    stats = TORCH.zoo.describe("cnn", params, (1, 8, 8), 10)
    assert isinstance(stats, ModelStats) and stats == describe("cnn", params, (1, 8, 8), 10)
    assert TORCH.zoo.parameter_bytes("cnn", params, (1, 8, 8), 10) == stats.param_bytes == 4 * stats.parameters
    network = TORCH.zoo.build("cnn", params, (1, 8, 8), 10, seed=1)
    assert sum(p.numel() for p in network.parameters()) == stats.parameters
    with pytest.raises(UserError, match="unknown family"):
        TORCH.zoo.describe("transformerz", {}, (1, 8, 8), 10)
    assert TORCH.zoo.parameter_bytes("fleet_no_such_module:build", {}, (1, 8, 8), 10) is None


def test_the_torch_framework_answers_for_the_cpu():
    assert TORCH.free_device_memory("cpu") is None  # the host's memory is the caller's to judge
    assert TORCH.device_name("cpu").startswith("cpu (")
    assert isinstance(TORCH.visible_gpus(), int) and TORCH.visible_gpus() >= 0
    assert TORCH.version() and TORCH.version()[0].isdigit()
    TORCH.synchronize("cpu")
    TORCH.release_memory("cpu")
    engine = TORCH.create_engine(EngineOptions(parse_spec(doc()).models[0], (1, 8, 8), 10))
    assert np.isfinite(engine.flat_parameters()).all()
