"""Adaptive searches in the spec: `sampler`, `budget`, placeholders with reserved ids, and the
one-line errors of what is not allowed; asked values applied to placeholders (`fleet.spec.asked`)."""

import json
import subprocess
import sys

import pytest
import yaml

from fleet.errors import UserError
from fleet.inspect import search_costs
from fleet.prediction import search_lines
from fleet.schedule.rates import RateTable
from fleet.spec import SpecError, parse_spec
from fleet.spec import search as spec_search
from fleet.spec.asked import asked_path, read_asked, with_asked
from preprocess.grouped import expand_over_groups

from conftest import REPO

SPACE = {"hidden": {"choice": [[32], [64], [64, 64]]}, "train.lr": {"loguniform": [1e-4, 1e-1]},
         "dropout": {"uniform": [0.0, 0.4]}}


def doc(entry=None, **overrides):
    entry = {"family": "mlp", "name": "s", "sampler": "tpe", "budget": 4, "search": SPACE, **(entry or {})}
    base = {"name": "t", "data": {"source": "digits"}, "models": [{"family": "mlp", "name": "ref"}, entry]}
    base.update(overrides)
    return base


def test_an_adaptive_entry_reserves_budget_placeholders_in_ask_order():
    spec = parse_spec(doc(), check_paths=False)
    ids = [m.id for m in spec.models]
    assert ids == ["ref", "s-000", "s-001", "s-002", "s-003"]
    slots = [m.search for m in spec.models[1:]]
    assert [s.index for s in slots] == [0, 1, 2, 3]
    assert {(s.study, s.sampler, s.budget) for s in slots} == {("s", "tpe", 4)}
    middle = spec.models[1]
    assert middle.params["hidden"] == [64] and middle.params["dropout"] == pytest.approx(0.2)
    assert middle.train.lr == pytest.approx(1e-4 ** 0.5 * 1e-1 ** 0.5)
    assert spec.models[0].search is None


def test_the_resolved_spec_of_a_search_round_trips():
    spec = parse_spec(doc(), check_paths=False)
    again = parse_spec(yaml.safe_load(spec.to_yaml()), check_paths=False)
    assert again.models == spec.models


def test_random_stays_the_default_and_draws_when_read():
    spec = parse_spec(doc({"sampler": "random", "budget": None, "samples": 3}), check_paths=False)
    assert len(spec.models) == 1 + 3 * 3 and all(m.search is None for m in spec.models)  # 3 choices x 3


@pytest.mark.parametrize("entry, words", [
    ({"budget": None}, ["models[1]", "budget"]),
    ({"samples": 3}, ["models[1]", "samples", "random"]),
    ({"sampler": "random"}, ["models[1]", "budget", "adaptive"]),
    ({"sampler": "annealing"}, ["models[1].sampler", "annealing", "tpe"]),
    ({"search": {}}, ["models[1]", "search"]),
    ({"budget": 0}, ["models[1].budget"]),
])
def test_bad_searches_are_one_line_errors(entry, words):
    with pytest.raises(SpecError) as caught:
        parse_spec(doc(entry), check_paths=False)
    message = str(caught.value)
    assert "\n" not in message and all(w in message for w in words), message


@pytest.mark.parametrize("method", ["sha", "hyperband"])
def test_searches_refuse_early_stopping_whose_rungs_wait_to_fill(method):
    with pytest.raises(SpecError, match=r"^scheduler\.early_stop: .*asha, median"):
        parse_spec(doc(scheduler={"early_stop": method}, train={"max_epochs": 9}), check_paths=False)
    parse_spec(doc(scheduler={"early_stop": "asha"}, train={"max_epochs": 9}), check_paths=False)


def test_a_search_over_groups_is_one_study_per_group_with_its_budget_each():
    grouped = doc(data={"source": "hdf5", "path": "/nowhere.h5", "image_size": 8, "group_by": {"dataset": "groups"}},
                  scheduler={"policy": "grouped"})
    spec = expand_over_groups(parse_spec(grouped, check_paths=False), [("Berlin", 300), ("Sao Paulo", 200)]).spec
    slots = {m.id: m.search for m in spec.models if m.search is not None}
    assert set(slots) == {f"s-00{k}-{g}" for g in ("berlin", "sao-paulo") for k in range(4)}
    assert {s.study for s in slots.values()} == {"s-berlin", "s-sao-paulo"}
    assert sorted((s.study, s.index) for s in slots.values()) == [(g, k) for g in ("s-berlin", "s-sao-paulo")
                                                                   for k in range(4)]
    assert {s.budget for s in slots.values()} == {4}
    same = RateTable.from_dict({"gpus_per_node": 1, "samples_per_epoch": 100,
                                "models": [{"id": m.id, "rates": {"1": 500.0}} for m in spec.models]})
    said = [line for line in search_lines(spec_search.searches_of(spec.models), same) if line]
    assert len(said) == 1 and said[0].startswith("searches s-berlin ... s-sao-paulo (one study per group, 2): "
                                                 "sampler tpe, budget 4 models each over hidden"), said
    again = parse_spec(spec.resolved(), check_paths=False)  # the run directory's spec.yaml keeps them
    assert {m.id: m.search for m in again.models if m.search is not None} == slots
    # an entry named like another's study of a group: refused in one line
    clash = {**grouped, "models": [grouped["models"][1], {**grouped["models"][1], "name": "s-berlin"}]}
    with pytest.raises(SpecError, match=r"^models\[\d\]\.name: .*would both be 's-berlin-berlin'"):
        expand_over_groups(parse_spec(clash, check_paths=False), [("Berlin", 300), ("berlin-berlin", 200)])


def test_two_searches_of_one_name_are_refused():
    entry = {"family": "mlp", "sampler": "tpe", "budget": 2, "search": SPACE}
    with pytest.raises(SpecError, match=r"^models\[1\]\.name: .*study 'mlp'"):
        parse_spec({"name": "t", "data": {"source": "digits"}, "models": [entry, entry]}, check_paths=False)


def test_a_sampler_whose_package_is_missing_is_named(monkeypatch):
    monkeypatch.setattr(spec_search.importlib.util, "find_spec", lambda name: None if name == "cmaes" else object())
    with pytest.raises(SpecError, match=r"^models\[1\]\.sampler: cmaes needs the package cmaes"):
        parse_spec(doc({"sampler": "cmaes"}), check_paths=False)


def test_fleet_validate_exits_2_with_one_line(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(doc({"samples": 2})))
    done = subprocess.run([sys.executable, "-m", "fleet", "validate", str(path)], capture_output=True, text=True,
                          cwd=REPO, timeout=120)
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and "samples" in lines[0], lines


def write_asked(run_dir, *records):
    path = asked_path(run_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_asked_values_replace_a_placeholders_middle(tmp_path):
    spec = parse_spec(doc(), check_paths=False)
    values = {"hidden": [32], "train.lr": 0.01, "dropout": 0.1}
    write_asked(tmp_path, {"model": "s-001", "study": "s", "trial": 0, "values": values})
    asked = with_asked(spec, read_asked(tmp_path))
    model = asked.model("s-001")
    assert model.params["hidden"] == [32] and model.params["dropout"] == 0.1 and model.train.lr == 0.01
    assert model.search == spec.model("s-001").search
    assert asked.model("s-000") == spec.model("s-000")
    again = parse_spec(yaml.safe_load(asked.to_yaml()), check_paths=False)
    assert with_asked(again, read_asked(tmp_path)) == asked


def test_a_torn_last_asked_line_is_left_out_and_a_bad_one_is_named(tmp_path):
    write_asked(tmp_path, {"model": "s-000", "study": "s", "trial": 0, "values": {}})
    with asked_path(tmp_path).open("a") as out:
        out.write('{"model": "s-0')
    assert list(read_asked(tmp_path)) == ["s-000"]
    write_asked(tmp_path, {"model": "ref", "study": "s", "trial": 0, "values": {}})
    with pytest.raises(UserError, match="'ref' is no placeholder"):
        with_asked(parse_spec(doc(), check_paths=False), read_asked(tmp_path))


def placeholder_rates(spec) -> RateTable:
    return RateTable.from_dict({"gpus_per_node": 1, "samples_per_epoch": 100, "models": [
        {"id": m.id, "rates": {"1": 500.0 + k}, "epochs": 3} for k, m in enumerate(spec.models)]})


def test_plans_say_the_budget_the_rates_over_the_architectures_and_that_values_are_decided_while_it_runs():
    spec = parse_spec(doc(), check_paths=False)
    searches = search_costs(spec)
    # hidden [32] / [64] (the middle) / [64, 64]; train.lr and dropout change no FLOPs
    assert searches["s"]["flops_per_sample"] == {"smallest": 4736, "middle": 9472, "largest": 17664}
    lines = [line for line in search_lines(searches, placeholder_rates(spec)) if line]
    assert len(lines) == 1
    # planned at 501 (s-000's); the largest 501 x 9472 / 17664, the smallest 501 x 9472 / 4736
    assert all(w in lines[0] for w in ("search s", "tpe", "budget 4", "s-000 ... s-003", "hidden, train.lr, dropout",
                                       "planned at 501 samples/s", "estimated 269 (largest architecture, 0.0177 MFLOPs/sample)",
                                       "1,002 (smallest, 0.00474)",
                                       "decided while the run trains")), lines
    bare = search_lines(spec_search.searches_of(spec.models), placeholder_rates(spec))[1]
    assert "planned at 501 samples/s" in bare and "estimated" not in bare  # a profile without the FLOPs
    assert search_lines(spec_search.searches_of(parse_spec(doc({"sampler": "random", "budget": None}),
                                                           check_paths=False).models), placeholder_rates(spec)) == []


def test_fleet_plan_and_simulate_say_a_profiles_searches(tmp_path, fleet_cli):
    spec = parse_spec(doc(), check_paths=False)
    profile = {**placeholder_rates(spec).to_dict(), "searches": search_costs(spec)}
    (tmp_path / "profile.json").write_text(json.dumps(profile))
    for command in (("plan", "profile.json", "--gpus", "2"), ("simulate", "profile.json", "--gpus", "2")):
        done = fleet_cli(*command, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        said = [line for line in done.stdout.splitlines() if line.startswith("search s:")]
        assert len(said) == 1 and "estimated 269 (largest" in said[0], done.stdout
    done = fleet_cli("simulate", "profile.json", "--gpus", "2", "--json", cwd=tmp_path)
    assert json.loads(done.stdout)["searches"][0].startswith("search s: sampler tpe, budget 4")
