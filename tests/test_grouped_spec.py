"""Learning over groups (issue 47), without MPI: `data.group_by` in the spec, the expansion of
configurations over the groups (`preprocess.grouped`), ids, the resolved spec's round trip,
each group's own split, and rates made epoch-equivalent."""

import json
import subprocess
import sys

import numpy as np
import pytest
import yaml
from PIL import Image

from conftest import REPO
from fleet.errors import UserError
from fleet.prediction import dry_run, epoch_equivalent
from fleet.report.status import render, replay
from fleet.runtime.control.setup import check_same_ensemble, prepare_run_dir
from fleet.schedule import RateTable
from fleet.schedule.rates import ModelProfile
from fleet.spec import SpecError, parse_spec
from fleet.spec.search import MAX_MODELS
from preprocess.grouped import (
    epoch_scales,
    expand_over_groups,
    expanded,
    group_split,
    load_run_spec,
    needs_expansion,
    unique_parts,
)
from preprocess.make import make_synthetic
from preprocess.readers import open_reader
from preprocess.split import split_three

SIZES = [("g000", 120), ("g001", 60), ("g002", 30), ("g003", 10)]


@pytest.fixture(scope="module")
def grouped_h5(tmp_path_factory):
    """400 samples of 4 classes in 4 Zipf-sized groups (dataset 'groups')."""
    path = tmp_path_factory.mktemp("grouped") / "data.h5"
    return make_synthetic(path, "hdf5", classes=4, samples=400, image_size=8, progress=False, groups=4)


def doc(data: dict | None = None, models: list | None = None, **more) -> dict:
    return {"name": "g", "data": data or {"source": "hdf5", "path": "/nowhere.h5", "image_size": 8,
                                          "group_by": {"dataset": "groups"}},
            "models": models or [{"family": "mlp", "name": "small"}, {"family": "mlp", "name": "wide",
                                                                       "params": {"hidden": [32]}}],
            "train": {"max_epochs": 2, "batch_size": 8}, **more}


def configurations():
    return parse_spec(doc(), check_paths=False)


# -- the spec --------------------------------------------------------------------------------


@pytest.mark.parametrize("data, scheduler, message", [
    ({"source": "synthetic", "group_by": {"dataset": "groups"}}, {},
     "data.group_by: {dataset: NAME} needs source 'hdf5', got 'synthetic'"),
    ({"source": "hdf5", "path": "/x.h5", "group_by": "directory"}, {},
     "data.group_by: directory needs source 'imagefolder', got 'hdf5'"),
    ({"source": "hdf5", "path": "/x", "group_by": {"dataset": "groups"}, "partitioned": True}, {"policy": "mop"},
     "scheduler.policy: 'mop' does not plan visits of data partitioned by its groups"),
    ({"source": "hdf5", "path": "/x", "group_by": {"dataset": "groups"}, "partitioned": True},
     {"policy": "group-task"}, "(data.partitioned with data.group_by); use grouped or auto"),
    ({"source": "hdf5", "path": "/x.h5", "group_by": {"dataset": "groups"}}, {"policy": "fleet-g"},
     "scheduler.policy: 'fleet-g' may share a stream between models of different groups"),
    ({"source": "hdf5", "path": "/x.h5", "group_by": {"dataset": ""}}, {},
     "data.group_by: expected directory or {dataset: NAME}, got {'dataset': ''}"),
    ({"source": "hdf5", "path": "/x.h5", "group_by": "rows"}, {},
     "data.group_by: expected directory or {dataset: NAME}, got 'rows'"),
    ({"source": "hdf5", "path": "/x.h5", "group_by": {"dataset": "groups"}, "min_group_samples": 0}, {},
     "data.min_group_samples: Input should be greater than 0"),
])
def test_bad_group_settings_are_one_line_errors(data, scheduler, message):
    with pytest.raises(SpecError) as caught:
        parse_spec(doc(data, scheduler=scheduler), check_paths=False)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_a_model_group_needs_group_by_and_every_model_names_one_or_none():
    plain = {"source": "digits"}
    with pytest.raises(SpecError, match=r"^models\[0\]\.group: 'g000' needs data.group_by$"):
        parse_spec(doc(plain, [{"family": "mlp", "group": "g000"}]), check_paths=False)
    with pytest.raises(SpecError, match=r"^models\[1\]\.group: missing; every model names its group or none"):
        parse_spec(doc(None, [{"family": "mlp", "name": "a", "group": "g0"}, {"family": "mlp", "name": "b"}]),
                   check_paths=False)


def test_auto_baseline_early_stopping_and_an_ensemble_section_run_groups():
    assert parse_spec(doc(scheduler={"policy": "auto"}), check_paths=False).scheduler.policy == "auto"
    for policy in ("grouped", "group-task", "model-task", "group-parallel", "baseline"):
        assert parse_spec(doc(scheduler={"policy": policy}), check_paths=False).scheduler.policy == policy
    assert configurations().data.min_group_samples == 20  # the documented default
    assert parse_spec(doc(ensemble={"size": 2}), check_paths=False).ensemble.size == 2  # one per group
    early = parse_spec(doc(scheduler={"early_stop": {"method": "asha", "min_epochs": 1}}), check_paths=False)
    assert early.early_stop_settings().method == "asha"  # rungs per group (tests/test_schedule_early_stop.py)


# -- expansion and ids ---------------------------------------------------------------------------


def test_each_configuration_expands_over_the_groups_large_enough():
    expansion = expand_over_groups(configurations(), SIZES)
    spec = expansion.spec
    assert [m.id for m in spec.models] == ["small-g000", "small-g001", "small-g002",
                                           "wide-g000", "wide-g001", "wide-g002"]
    assert [m.group for m in spec.models] == ["g000", "g001", "g002"] * 2
    assert spec.models[3].params["hidden"] == [32] and len({m.seed for m in spec.models}) == 6
    assert spec.entry(4) == "models[1]"  # errors name the configuration's entry
    assert expansion.skipped == (("g003", 10),)
    assert expansion.skipped_line() == ("skipped 1 group(s) under data.min_group_samples (20 samples): g003 (10)")
    assert not needs_expansion(spec) and expanded(spec) is spec


def test_ids_are_sanitised_and_made_unique():
    assert unique_parts(["São Paulo", "a-b", "A b", "a b-2", "***"]) == {
        "***": "group", "A b": "a-b", "São Paulo": "s-o-paulo", "a b-2": "a-b-2", "a-b": "a-b-3"}
    models = [{"family": "mlp", "name": "m"}, {"family": "mlp", "name": "m-x"}]
    spec = expand_over_groups(parse_spec(doc(models=models), check_paths=False),
                              [("x-y", 30), ("y", 30), ("X", 30)]).spec
    ids = [m.id for m in spec.models]
    assert len(set(ids)) == len(ids) == 6
    assert ids == ["m-x", "m-x-y", "m-y", "m-x-x", "m-x-x-y", "m-x-y-2"]  # m-x's group x-y: taken by m's


def test_too_many_models_or_no_group_left_are_one_line_errors():
    spec = configurations()
    many = [(f"k{i}", 50) for i in range(MAX_MODELS // 2 + 1)]
    with pytest.raises(SpecError, match=r"^data.group_by: 2 configuration\(s\) x 5,001 group\(s\) = 10,002 models "
                                        r"\(at most 10,000\)$"):
        expand_over_groups(spec, many)
    with pytest.raises(SpecError, match=r"^data.min_group_samples: every group has fewer than 20 samples "
                                        r"\(the largest 19, of 2 group\(s\)\)"):
        expand_over_groups(spec, [("a", 19), ("b", 3)])


def test_the_loader_reads_the_groups_and_names_a_missing_dataset(grouped_h5, tmp_path):
    said = []
    path = tmp_path / "s.yaml"
    data = {"source": "hdf5", "path": str(grouped_h5), "image_size": 8, "group_by": {"dataset": "groups"},
            "min_group_samples": 60}
    path.write_text(yaml.safe_dump(doc(data, run_dir=str(tmp_path / "run"))))
    spec = load_run_spec(path, say=said.append)
    sizes = dict(zip(*np.unique(open_reader(spec.data).group_keys("groups"), return_counts=True)))
    kept = sorted(k for k, n in sizes.items() if n >= 60)
    assert [m.group for m in spec.models] == kept * 2
    assert len(said) == (1 if len(kept) < len(sizes) else 0)
    data["group_by"] = {"dataset": "sites"}
    path.write_text(yaml.safe_dump(doc(data)))
    with pytest.raises(UserError, match=r"^data.group_by: .*no dataset 'sites' of group keys"):
        load_run_spec(path)
    done = subprocess.run([sys.executable, "-m", "fleet", "validate", str(path)], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1 and "'sites'" in done.stderr


# -- the resolved spec --------------------------------------------------------------------------


def test_the_resolved_spec_parses_back_without_expanding_and_resumes(tmp_path):
    spec = expand_over_groups(configurations(), SIZES).spec.model_copy(update={"run_dir": str(tmp_path / "run")})
    text = spec.to_yaml()
    assert "group: g001" in text
    again = parse_spec(yaml.safe_load(text), check_paths=False)
    assert again == spec and not needs_expansion(again)
    assert expanded(again) is again  # no data read: its path does not exist
    prepare_run_dir(spec)
    check_same_ensemble(tmp_path / "run", spec)  # the resume check accepts it
    fewer = spec.model_copy(update={"models": spec.models[:-1]})
    with pytest.raises(UserError, match="holds a run of a different ensemble"):
        check_same_ensemble(tmp_path / "run", fewer)


# -- each group's split, rates --------------------------------------------------------------------


def test_each_group_splits_its_own_samples_only():
    rng = np.random.default_rng(3)
    labels = rng.integers(0, 3, 300)
    groups = np.array(["a", "b", "c"])[rng.integers(0, 3, 300)]
    seen = []
    for key in ("a", "b", "c"):
        train, val, test = group_split(labels, groups, key, 0.2, 0.1, seed=7)
        members = np.flatnonzero(groups == key)
        assert sorted(np.concatenate([train, val, test])) == list(members)
        assert set(groups[np.concatenate([train, val, test])]) == {key}
        assert len(val) == pytest.approx(0.2 * len(members), abs=3) and len(test) > 0
        local = split_three(labels[members], 0.2, 0.1, seed=0)
        assert not all(np.array_equal(members[a], b) for a, b in zip(local, (train, val, test)))  # seeded by key
        seen.append(val)
    again = group_split(labels, groups, "b", 0.2, 0.1, seed=7)
    assert np.array_equal(again[1], seen[1])
    with pytest.raises(UserError, match="no sample of group 'z'"):
        group_split(labels, groups, "z", 0.2, 0.0, seed=7)


def test_rates_become_epoch_equivalent():
    table = RateTable((ModelProfile("a-g0", (100.0, 180.0)), ModelProfile("a-g1", (100.0, 180.0))), 2, 1000)
    scaled = epoch_equivalent(table, {"a-g0": 4.0})
    assert scaled.rate("a-g0", 2) == 720.0 and scaled.rate("a-g1", 1) == 100.0
    assert scaled.samples_per_epoch == 1000 and epoch_equivalent(table, {}) is table


def test_an_image_folder_of_group_folders_gives_groups_and_the_union_of_classes(tmp_path):
    root = tmp_path / "folders"
    layout = {"berlin": {"cat": 3, "dog": 2}, "São Paulo": {"dog": 4, "eel": 1}}
    for group, classes in layout.items():
        for name, count in classes.items():
            (root / group / name).mkdir(parents=True)
            for i in range(count):
                Image.new("RGB", (8, 8), (i * 40, 0, 0)).save(root / group / name / f"{i}.png")
    data = {"source": "imagefolder", "path": str(root), "image_size": 8, "group_by": "directory",
            "min_group_samples": 1}
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(doc(data, preprocess=["decode"], run_dir=str(tmp_path / "run"))))
    spec = load_run_spec(path)
    assert [(m.id, m.group) for m in spec.models] == [  # keys in sorted order: capitals first
        ("small-s-o-paulo", "São Paulo"), ("small-berlin", "berlin"), ("wide-s-o-paulo", "São Paulo"),
        ("wide-berlin", "berlin")]
    with open_reader(spec.data) as reader:
        assert reader.class_names == ["cat", "dog", "eel"] and reader.num_classes == 3
        assert reader.group_keys() == ["São Paulo"] * 5 + ["berlin"] * 5
        assert reader.labels.tolist() == [1, 1, 1, 1, 2, 0, 0, 0, 1, 1]
    (root / "empty" / "cat").mkdir(parents=True)
    with pytest.raises(UserError, match="empty: a group folder without images"):
        load_run_spec(path)


def test_epoch_scales_are_the_whole_data_epoch_over_each_group_s(grouped_h5):
    spec = expanded(parse_spec(doc({"source": "hdf5", "path": str(grouped_h5), "image_size": 8,
                                    "group_by": {"dataset": "groups"}, "min_group_samples": 1})))
    with open_reader(spec.data) as reader:
        keys, labels = np.asarray(reader.group_keys("groups")), reader.labels
    whole = len(split_three(labels, 0.1, 0.0, 0)[0])
    scales = epoch_scales(spec)
    for model in spec.models:
        assert scales[model.id] == whole / len(group_split(labels, keys, model.group, 0.1, 0.0, 0)[0])
    assert min(scales.values()) > 1 and epoch_scales(configurations().model_copy(
        update={"data": configurations().data.model_copy(update={"group_by": None})})) == {}


def test_status_counts_the_groups_whose_every_model_converged():
    groups = {"a-g0": "g0", "b-g0": "g0", "a-g1": "g1", "b-g1": "g1"}
    events = [{"event": "converged", "model": m, "reason": "max_epochs"} for m in ("a-g0", "b-g0", "a-g1")]
    job = replay(events, {m: 2 for m in groups}, groups)
    assert ", 3/4 models converged, 1/2 groups done" in render(job, "run")[1]
    assert "groups" not in render(replay(events, {m: 2 for m in groups}), "run")[1]


def test_the_dry_run_of_groups_compares_the_policies_with_model_task(grouped_h5, tmp_path):
    """`fleet profile`'s report over groups: grouped and its three baselines, each against
    model-task (one model per GPU, what users run), as baseline is on whole data."""
    path = tmp_path / "s.yaml"
    data = {"source": "hdf5", "path": str(grouped_h5), "image_size": 8, "group_by": {"dataset": "groups"}}
    path.write_text(yaml.safe_dump(doc(data, scheduler={"policy": "grouped"}, cluster={"gpus_per_node": 2})))
    spec = load_run_spec(path)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    profile = {"schema": 1, "gpus_per_node": 2, "samples_per_epoch": 320,
               "models": [{"id": m.id, "rates": {"1": 1000.0, "2": 1800.0}} for m in spec.models]}
    (run_dir / "profile.json").write_text(json.dumps(profile))
    report = dry_run(spec, run_dir)
    table = report[report.index("\npolicy ") + 1:].splitlines()
    assert table[0].split()[-2:] == ["vs", "model-task"]
    assert {line.split()[0] for line in table[2:6]} == {"grouped", "group-task", "model-task", "group-parallel"}
    assert (run_dir / "plan.json").exists()
