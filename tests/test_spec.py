import subprocess
import sys

import pytest
import yaml

from fleet.spec import SpecError, load_spec, parse_spec
from fleet.spec.sections import POLICIES

from conftest import REPO


def doc(**overrides):
    base = {"name": "t", "data": {"source": "digits"}, "models": [{"family": "mlp"}]}
    base.update(overrides)
    return base


def test_grid_times_samples_expands_with_stable_readable_ids():
    models = [
        {
            "family": "resnet",
            "samples": 3,
            "search": {"width": {"choice": [8, 16]}, "blocks": {"int": [1, 3], "size": 4}},
        },
        {"family": "resnet", "params": {"width": 4}},
        {"family": "cnn", "name": "baseline-cnn"},
    ]
    spec = parse_spec(doc(models=models, seed=3))
    ids = [m.id for m in spec.models]
    assert ids == [f"resnet-{k:03d}" for k in range(7)] + ["baseline-cnn"]
    widths = [m.params["width"] for m in spec.models[:6]]
    assert widths == [8, 8, 8, 16, 16, 16]
    assert all(len(m.params["blocks"]) == 4 and 1 <= min(m.params["blocks"]) <= max(m.params["blocks"]) <= 3
               for m in spec.models[:6])
    again = parse_spec(doc(models=models, seed=3))
    assert again.models == spec.models
    other_seed = parse_spec(doc(models=models, seed=4))
    assert [m.params for m in other_seed.models] != [m.params for m in spec.models]


def test_defaults_are_filled_and_train_overrides_merge():
    models = [
        {"family": "mlp", "train": {"optimizer": "adam", "lr": 0.001}},
        {"family": "lstm", "search": {"train.lr": {"loguniform": [1e-4, 1e-2]}}, "samples": 2},
    ]
    spec = parse_spec(doc(models=models, train={"batch_size": 16, "max_epochs": 3}))
    mlp, *lstms = spec.models
    assert mlp.params == {"hidden": [256], "dropout": 0.0}
    assert mlp.train.optimizer.value == "adam" and mlp.train.lr == 0.001 and mlp.train.batch_size == 16
    assert all(1e-4 <= m.train.lr <= 1e-2 and m.train.max_epochs == 3 for m in lstms)
    assert lstms[0].train.lr != lstms[1].train.lr


def test_per_model_seeds_differ_and_ignore_order():
    a = parse_spec(doc(models=[{"family": "mlp", "name": "x"}, {"family": "mlp", "name": "y"}]))
    b = parse_spec(doc(models=[{"family": "mlp", "name": "y"}, {"family": "mlp", "name": "x"}]))
    assert a.model("x").seed != a.model("y").seed
    assert a.model("x").seed == b.model("x").seed


def test_data_defaults_per_source():
    digits = parse_spec(doc()).data
    assert digits.image_size == (8, 8) and digits.channels == 1 and digits.classes == 10
    synthetic = parse_spec(doc(data={"source": "synthetic"})).data
    assert synthetic.image_size == (32, 32) and synthetic.channels == 3 and synthetic.samples == 2000


def test_test_fraction_defaults_to_none_held_out_and_is_in_the_resolved_spec():
    assert parse_spec(doc()).data.test_fraction == 0.0
    spec = parse_spec(doc(data={"source": "digits", "test_fraction": 0.2}))
    assert spec.resolved()["data"]["test_fraction"] == 0.2
    assert parse_spec(yaml.safe_load(spec.to_yaml())) == spec


def test_resolved_spec_round_trips_and_run_dir_override():
    spec = load_spec(REPO / "examples" / "quickstart.yaml", check_paths=False, run_dir="/tmp/elsewhere")
    assert spec.run_dir == "/tmp/elsewhere"
    again = parse_spec(yaml.safe_load(spec.to_yaml()), check_paths=False)
    assert again == spec


def test_spec_is_frozen():
    spec = parse_spec(doc())
    with pytest.raises(Exception):
        spec.name = "other"


def test_user_family_passes_params_through():
    spec = parse_spec(doc(models=[{"family": "mypkg.nets:tiny", "params": {"depth": 3}}]))
    assert spec.models[0].id == "tiny-000" and spec.models[0].params == {"depth": 3}


def test_preprocessors_auto_and_policies():
    spec = parse_spec(doc(cluster={"preprocessors_per_node": "auto"}, scheduler={"policy": "fleet-adaptive"}))
    assert spec.cluster.preprocessors_per_node == "auto"
    assert set(POLICIES) == {"fleet-g", "fleet-l", "baseline", "homogeneous", "fleet-adaptive", "mop", "fleet-hop",
                             "grouped", "group-task", "model-task", "group-parallel"}


def test_partitioned_data_needs_a_hopping_policy():
    data = {"source": "synthetic", "partitioned": True}
    with pytest.raises(SpecError) as err:
        parse_spec(doc(data=data, scheduler={"policy": "fleet-g"}), check_paths=False)
    assert str(err.value) == ("scheduler.policy: 'fleet-g' trains on whole data; partitioned data (data.partitioned) "
                              "needs a hopping policy: mop, fleet-hop")
    assert parse_spec(doc(data=data, scheduler={"policy": "fleet-hop", "delta": 0.2}), check_paths=False)
    with pytest.raises(SpecError, match="'mop' moves models between partitions of the data, and data.partitioned is "
                                         "false"):
        parse_spec(doc(scheduler={"policy": "mop"}))


def test_errors_are_single_lines():
    with pytest.raises(SpecError) as err:
        parse_spec(doc(models=[{"family": "resnet", "params": {"blocks": [3, 0, 6, 3]}}]))
    assert str(err.value) == "models[0].params.blocks: expected 4 positive integers, got [3, 0, 6, 3]"


def test_examples_validate():
    for path in (REPO / "examples").glob("*.yaml"):
        load_spec(path, check_paths=False)


def test_each_model_knows_its_entry_and_equal_specs_ignore_it():
    models = [{"family": "mlp", "search": {"hidden": {"choice": [[8], [16]]}}}, {"family": "cnn"}]
    spec = parse_spec(doc(models=models))
    assert [spec.entry(k) for k in range(3)] == ["models[0]", "models[0]", "models[1]"]
    again = parse_spec(yaml.safe_load(spec.to_yaml()))
    assert again.entry(2) == "models[2]"  # the resolved spec writes one entry per model
    assert again == spec


def test_a_reader_that_goes_away_ends_a_command_quietly(tmp_path):
    """`fleet validate spec | head -0`: the pipe closes before fleet writes; no traceback."""
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump(doc()))  # a valid spec (its data built in, unlike the examples')
    job = subprocess.Popen([sys.executable, "-m", "fleet", "validate", str(spec)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO)
    job.stdout.close()  # before the interpreter has even imported fleet
    _, err = job.communicate(timeout=60)
    assert job.returncode == 1 and err == b""
