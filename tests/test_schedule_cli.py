"""`fleet plan` and `fleet simulate` as a user runs them (subprocesses, via conftest's fleet_cli)."""

import json

import pytest

PROFILE = {
    "schema": 1,
    "gpus_per_node": 2,
    "samples_per_epoch": 600,
    "created": "2026-11-22T10:00:00Z",
    "models": [
        {"id": "fast", "rates": {"1": 60, "2": 110, "3": 150, "4": 180}, "epochs": 3, "param_bytes": 40_000_000},
        {"id": "mid", "rates": {"1": 30, "2": 57, "3": 81, "4": 103}, "epochs": 2, "batch_size": 32},
        {"id": "slow", "rates": {"1": 15, "2": 29, "3": 42, "4": 54}, "epochs": 4},
        {"id": "tiny", "rates": {"1": 55, "2": 100}, "epochs": 5},
    ],
}


@pytest.fixture
def profile(tmp_path):
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(PROFILE))
    return path


def test_plan_writes_plan_json(profile, tmp_path, fleet_cli):
    done = fleet_cli("plan", str(profile), "--gpus", "6", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "epochs from the profile's 'epochs'" in done.stdout
    assert "round 0" in done.stdout and "fast" in done.stdout
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["policy"] == "fleet-g" and plan["gpus_per_node"] == 2
    seen = set()
    for rnd in plan["rounds"]:
        assert isinstance(rnd["index"], int)
        for member in rnd["members"]:
            assert member["gpus"] and all(0 <= g < 6 for g in member["gpus"])
            assert member["nodes"] == sorted({g // 2 for g in member["gpus"]})
            seen.add(member["model"])
    assert seen == {"fast", "mid", "slow", "tiny"}


def test_plan_takes_the_measured_decoding_as_a_limit(profile, tmp_path, fleet_cli):
    # Baseline on 2 GPUs (1 node): one preprocessor decoding 40 samples/s in all, where the
    # models alone would consume 60 + 30 samples/s: every prediction gets longer, and says why.
    free = fleet_cli("plan", str(profile), "--gpus", "2", "--policy", "baseline", "--json", cwd=tmp_path)
    data = dict(PROFILE, preprocessing={"samples_per_s": {"1": 40.0}, "per_node": 1})
    profile.write_text(json.dumps(data))
    limited = fleet_cli("plan", str(profile), "--gpus", "2", "--policy", "baseline", "--json", cwd=tmp_path)
    assert free.returncode == 0 and limited.returncode == 0, limited.stderr
    assert json.loads(limited.stdout)["makespan_s"] > 1.2 * json.loads(free.stdout)["makespan_s"]
    table = fleet_cli("plan", str(profile), "--gpus", "2", "--policy", "baseline", cwd=tmp_path)
    assert "at most 40 samples/s for all running streams together" in table.stdout


def test_plan_json_output_and_max_epochs(profile, tmp_path, fleet_cli):
    data = dict(PROFILE, models=[{k: v for k, v in m.items() if k != "epochs"} for m in PROFILE["models"]])
    profile.write_text(json.dumps(data))
    out = tmp_path / "elsewhere.json"
    done = fleet_cli("plan", str(profile), "--gpus", "4", "--policy", "fleet-adaptive", "--max-epochs", "2",
                 "--json", "--out", str(out), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)
    assert printed == json.loads(out.read_text())
    assert printed["epochs_source"] == "max-epochs" and printed["policy"] == "fleet-adaptive"


def write_spec(path, **scheduler):
    spec = {"name": "t", "data": {"source": "digits"}, "models": [{"family": "mlp"}], "scheduler": scheduler}
    path.write_text(json.dumps(spec))  # JSON is YAML
    return str(path)


def plan_json(fleet_cli, profile, tmp_path, *args) -> dict:
    done = fleet_cli("plan", str(profile), "--gpus", "6", "--json", *args, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def rounds_of(plan: dict) -> list[list[tuple[str, int]]]:
    return [sorted((m["model"], len(m["gpus"])) for m in rnd["members"]) for rnd in plan["rounds"]]


def test_plan_with_a_spec_uses_its_alpha(profile, tmp_path, fleet_cli):
    # 6 GPUs, fleet-g: with alpha 0.8 the first round ends when fast converges (3 of 6 GPUs
    # busy); with alpha 0.3 it runs on until mid and fast are done, and slow gets all 6 next.
    default = plan_json(fleet_cli, profile, tmp_path)
    spec = write_spec(tmp_path / "s.yaml", policy="fleet-g", alpha=0.3)
    low_alpha = plan_json(fleet_cli, profile, tmp_path, "--spec", spec)
    assert low_alpha["policy"] == "fleet-g"
    assert len(default["rounds"]) == 3 and len(low_alpha["rounds"]) == 2
    assert rounds_of(low_alpha)[1] == [("slow", 6)]
    assert low_alpha["makespan_s"] < default["makespan_s"]
    same = plan_json(fleet_cli, profile, tmp_path, "--spec", write_spec(tmp_path / "d.yaml", policy="fleet-g"))
    assert same["rounds"] == default["rounds"]


def test_plan_with_a_spec_stops_models_at_its_rungs(profile, tmp_path, fleet_cli):
    # asha, rungs at 1 and 3 epochs keeping 1 in 3: most models stop at their first rung, so
    # the plan trains fewer epochs and ends sooner than the same policy without it
    plain = plan_json(fleet_cli, profile, tmp_path, "--spec", write_spec(tmp_path / "p.yaml", policy="fleet-g"))
    spec = {"name": "t", "data": {"source": "digits"}, "train": {"max_epochs": 5},
            "models": [{"family": "mlp"}], "scheduler": {"policy": "fleet-g",
                                                          "early_stop": {"method": "asha", "reduction": 3}}}
    (tmp_path / "es.yaml").write_text(json.dumps(spec))
    stopped = plan_json(fleet_cli, profile, tmp_path, "--spec", str(tmp_path / "es.yaml"))
    assert stopped["makespan_s"] < plain["makespan_s"]


def test_plan_with_a_spec_uses_its_delta(profile, tmp_path, fleet_cli):
    # fleet-l with delta 1 samples/s matches no two models: fast runs alone on all 6 GPUs.
    default = plan_json(fleet_cli, profile, tmp_path, "--policy", "fleet-l")
    spec = write_spec(tmp_path / "s.yaml", policy="fleet-l", delta=1.0)
    tight = plan_json(fleet_cli, profile, tmp_path, "--spec", spec)
    assert tight["policy"] == "fleet-l" and rounds_of(tight)[0] == [("fast", 6)]
    assert rounds_of(default)[0] != [("fast", 6)] and tight["makespan_s"] != default["makespan_s"]


def test_plan_with_a_spec_and_another_policy_takes_that_policys_defaults(profile, tmp_path, fleet_cli):
    spec = write_spec(tmp_path / "s.yaml", policy="fleet-g", alpha=0.3)
    other = plan_json(fleet_cli, profile, tmp_path, "--spec", spec, "--policy", "fleet-l")
    assert other == plan_json(fleet_cli, profile, tmp_path, "--policy", "fleet-l")


def test_plan_with_a_spec_whose_policy_takes_no_such_option_is_one_line(profile, tmp_path, fleet_cli):
    spec = write_spec(tmp_path / "s.yaml", policy="baseline", delta=5)
    done = fleet_cli("plan", str(profile), "--gpus", "6", "--spec", spec, cwd=tmp_path)
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        "fleet plan: error: scheduler.delta: policy 'baseline' takes no such option (it takes none)"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["plan", "missing.json", "--gpus", "4"], "missing.json: no such file"),
        (["plan", "{profile}", "--gpus", "0"], "--gpus: expected a positive integer"),
        (["plan", "{profile}", "--gpus", "four"], "--gpus: expected a positive integer"),
        (["plan", "{profile}", "--gpus", "4", "--policy", "magic"], "valid: fleet-g, fleet-l, baseline"),
        (["plan", "{profile}", "--gpus", "4", "--spec", "missing.yaml"], "missing.yaml: no such file"),
        (["simulate", "{profile}", "--gpus", "4", "--policies", "fleet-g,magic"], "--policies: unknown 'magic'"),
        (["simulate", "--gpus", "4"], "either a profile.json or --workload"),
        (["simulate", "--workload", "paper7", "--gpus", "4"], "--workload: unknown 'paper7'; valid: paper100"),
        (["simulate", "{profile}", "--gpus", "4,x"], "--gpus: expected positive integers"),
        (["simulate", "--workload", "paper100"], "--gpus: required (only --workload family"),
        (["simulate", "--workload", "family", "--family-ratio", "3"], "--family-ratio: expected GPUs per model in 0.125..2"),
        (["simulate", "--workload", "family", "--family-ratio", "0"], "--family-ratio: expected a positive number"),
        (["simulate", "--workload", "family", "--family-gpus-per-node", "5"],
         "--family-gpus-per-node: expected one of 4, 6, 8, got 5"),
        (["simulate", "--workload", "family", "--family-shape", "flat"], "--family-shape: unknown 'flat'; valid: issue"),
        (["simulate", "--workload", "paper100", "--gpus", "4", "--family-shape", "heavy"],
         "--family-shape: only with --workload family"),
        (["simulate", "--workload", "family", "--gpus", "4", "--family-ratio", "1"],
         "--family-ratio: give it or --gpus, not both"),
        (["simulate", "--workload", "family", "--seed", "-1"], "--seed: expected a non-negative integer"),
        (["simulate", "{profile}", "--gpus", "4", "--seeds", "0"], "--seeds: expected a positive integer"),
        (["simulate", "{profile}", "--gpus", "4", "--noise-model", "stop-rule"], "need a built-in --workload"),
        (["simulate", "{profile}", "--gpus", "4", "--models", "8"], "need a built-in --workload"),
        (["simulate", "{profile}", "--gpus", "6", "--partitions", "2"],
         "--partitions: on --gpus 6 (3 nodes of 2): 2 partitions do not fit 3 nodes"),
        (["simulate", "{profile}", "--gpus", "4", "--partitions", "2", "--policies", "mop,fleet-g"],
         "--policies: fleet-g cannot run on partitioned data (--partitions); choose from mop, fleet-hop"),
        (["simulate", "{profile}", "--gpus", "4", "--true-rates", "missing.json"], "missing.json: no such file"),
        (["simulate", "{profile}", "--gpus", "4", "--true-rates", "{partial}"],
         "--true-rates: {partial} has no rates for 1 model(s) of the input, e.g. tiny"),
        (["simulate", "{profile}", "--gpus", "4", "--checkpoint-s", "-1"], "--checkpoint-s: expected a number >= 0"),
        (["simulate", "{profile}", "--gpus", "4", "--early-stop", "asha", "--reduction", "1"],
         "--reduction: must be a number > 1, got 1.0"),
        (["simulate", "{profile}", "--gpus", "4", "--early-stop", "nope"], "argument --early-stop: invalid choice"),
        (["simulate", "{profile}", "--gpus", "4", "--early-stop", "hyperband", "--reduction", "1.0000001"],
         "--reduction: 1.0000001 is too close to 1"),
        (["simulate", "{profile}", "--gpus", "4", "--early-stop", "asha", "--min-epochs", "100"],
         "--min-epochs: must be below"),
        (["simulate", "{profile}", "--gpus", "4", "--groups", "5"], "--groups: needs --workload"),
        (["simulate", "--workload", "paper100", "--gpus", "4", "--groups", "5", "--policies", "fleet-g"],
         "--policies: fleet-g may mix groups in a stream; with --groups choose from grouped"),
        (["simulate", "--workload", "paper100", "--gpus", "4", "--groups", "5", "--configurations", "101"],
         "--groups: configurations must be 1..100"),
        (["simulate", "--workload", "paper100", "--gpus", "8", "--groups", "5", "--partitions", "2", "--policies",
          "group-task"], "--policies: group-task does not plan visits of data partitioned by its groups"),
        (["simulate", "--workload", "paper100", "--gpus", "12", "--groups", "5", "--partitions", "2"],
         "--groups: 2 partitions do not fit 3 nodes"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, message, profile, tmp_path, fleet_cli):
    partial = tmp_path / "partial.json"
    partial.write_text(json.dumps(dict(PROFILE, models=PROFILE["models"][:3])))
    done = fleet_cli(*[a.format(profile=profile, partial=partial) for a in args], cwd=tmp_path)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and message.format(partial=partial) in lines[0], done.stderr
    assert "Traceback" not in done.stderr


def test_malformed_profile_names_file_and_field(profile, tmp_path, fleet_cli):
    bad = dict(PROFILE, models=[{"id": "x", "rates": {"1": -5}}])
    profile.write_text(json.dumps(bad))
    done = fleet_cli("plan", str(profile), "--gpus", "4", cwd=tmp_path)
    assert done.returncode == 2
    assert "profile.json: models[0].rates.1: expected samples/s > 0" in done.stderr


def test_simulate_profile_table_json_and_chart(profile, tmp_path, fleet_cli):
    chart = tmp_path / "fig.png"
    done = fleet_cli("simulate", str(profile), "--gpus", "2,6", "--policies", "fleet-g,fleet-adaptive",
                 "--seeds", "2", "--chart", str(chart), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "vs base" in done.stdout and "/LB2" in done.stdout and "fleet-adaptive" in done.stdout
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    done = fleet_cli("simulate", str(profile), "--gpus", "6", "--json", cwd=tmp_path)
    rows = json.loads(done.stdout)["rows"]
    assert {r["policy"] for r in rows} == {"baseline", "homogeneous", "fleet-l", "fleet-g"}
    for r in rows:
        assert r["makespan_lb2"] >= 1 - 1e-9 and r["makespan_lb1"] >= r["makespan_lb2"] - 1e-9
    baseline = next(r for r in rows if r["policy"] == "baseline")
    assert baseline["decoded_vs_baseline"] == pytest.approx(1.0)


def test_simulate_with_true_rates_predicts_policy_auto_s_switch(tmp_path, fleet_cli):
    """The policies plan with the profile and train at --true-rates; auto hands over as a run would."""
    import switch_case

    planned, truth = tmp_path / "planned.json", tmp_path / "truth.json"
    planned.write_text(json.dumps(switch_case.profile(switch_case.PLANNED, 1438)))
    truth.write_text(json.dumps(switch_case.profile(switch_case.TRUE, 1438)))
    done = fleet_cli("simulate", str(planned), "--gpus", "4", "--policies", "auto,fleet-l", "--true-rates",
                     str(truth), "--checkpoint-s", "0.05", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"true rates from {truth}" in done.stdout and "auto (fleet-l)" in done.stdout
    assert "auto on 4 GPUs, seed 0: switched fleet-l -> fleet-g at 1s" in done.stdout, done.stdout
    same = fleet_cli("simulate", str(planned), "--gpus", "4", "--policies", "auto", "--json", cwd=tmp_path)
    row = json.loads(same.stdout)["rows"][0]
    assert row["chosen"] == ["fleet-l"] and row["switches"] == [[]]


def test_simulate_with_early_stopping_on_the_models_learning_curves(tmp_path, fleet_cli):
    """Each policy runs twice, the second time stopping models at rungs on their stop-rule
    curves: far fewer model-epochs and GPU-hours, as a run with scheduler.early_stop would."""
    done = fleet_cli("simulate", "--workload", "paper100", "--models", "30", "--noise-model", "stop-rule",
                     "--gpus", "8", "--policies", "fleet-g", "--early-stop", "sha", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    rows = {row["policy"]: row for row in json.loads(done.stdout)["rows"]}
    full, halved = rows["fleet-g"], rows["fleet-g+sha"]
    assert halved["model_epochs"] < full["model_epochs"] / 3 and halved["gpu_hours"] < full["gpu_hours"] / 3
    plain = fleet_cli("simulate", "--workload", "paper100", "--models", "12", "--gpus", "4", "--policies", "fleet-l",
                      "--early-stop", "asha", cwd=tmp_path)
    assert "fleet-l+asha" in plain.stdout and "rung arithmetic only" in plain.stdout and "GPU h" in plain.stdout


def test_simulate_builtin_workload(tmp_path, fleet_cli):
    done = fleet_cli("simulate", "--workload", "paper100", "--gpus", "40", "--policies", "fleet-g", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "workload paper100" in done.stdout and "fleet-g" in done.stdout


def test_simulate_over_groups_compares_the_four_policies_with_the_grouped_bound(tmp_path, fleet_cli):
    done = fleet_cli("simulate", "--workload", "paper100", "--gpus", "8", "--groups", "6", "--group-skew", "1.5",
                     "--configurations", "2", "--own-decode", "100", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    rows = {r["policy"]: r for r in json.loads(done.stdout)["rows"]}
    assert set(rows) == {"grouped", "group-task", "model-task", "group-parallel"}
    assert all(r["makespan_lb"] >= 1 - 1e-9 for r in rows.values())
    assert rows["grouped"]["decoded"] < rows["model-task"]["decoded"]  # a group's stream decodes for both


def test_simulate_over_groups_on_parts_runs_grouped_visits_within_the_bound(tmp_path, fleet_cli):
    done = fleet_cli("simulate", "--workload", "paper100", "--gpus", "8", "--groups", "6", "--group-skew", "1.5",
                     "--configurations", "2", "--partitions", "2", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert "on 2 parts" in out["input"] and [r["policy"] for r in out["rows"]] == ["grouped"]
    assert 1 - 1e-9 <= out["rows"][0]["makespan_lb"] < 2.0


def test_simulate_a_family_instance_on_its_own_gpus_reproducibly(tmp_path, fleet_cli):
    """``--workload family --seed S`` rebuilds instance S of the cell: the same drawn GPU count
    and parameters, the same makespans, every time."""
    args = ["simulate", "--workload", "family", "--models", "24", "--seed", "1002", "--seeds", "2", "--family-shape",
            "bimodal", "--family-gpus-per-node", "4", "--policies", "fleet-g", "--json"]
    first, again = (fleet_cli(*args, cwd=tmp_path) for _ in range(2))
    assert first.returncode == 0, first.stderr
    document = json.loads(first.stdout)
    assert document == json.loads(again.stdout)
    family = document["family"]
    assert [p["seed"] for p in family] == [1002, 1003] and {p["gpus_per_node"] for p in family} == {4}
    assert {p["shape"] for p in family} == {"bimodal"}
    assert sorted(r["gpus"] for r in document["rows"]) == sorted({p["gpus"] for p in family})
    assert document["input"].startswith("workload family (bimodal, * GPUs/model, 4 GPUs/node; 24 models; seed 1002..1003")
    table = fleet_cli("simulate", "--workload", "family", "--models", "24", "--seed", "1002", "--family-ratio", "0.5",
                      "--policies", "fleet-g", cwd=tmp_path)
    assert table.returncode == 0, table.stderr
    assert "family seed 1002: 24 models on 12 GPUs (0.5/model)" in table.stdout and "/LB2" in table.stdout


def test_simulate_scale_workload_under_the_stop_rule_noise_model(tmp_path, fleet_cli):
    done = fleet_cli("simulate", "--workload", "scale", "--models", "30", "--gpus", "12", "--policies",
                     "fleet-adaptive", "--noise-model", "stop-rule", "--estimate-noise", "0.3", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert document["input"] == "workload scale (30 models), stop-rule noise"
    assert document["noise_model"] == "stop-rule" and document["estimate_noise"] == 0.3
    assert [r["policy"] for r in document["rows"]] == ["fleet-adaptive"]
    assert document["rows"][0]["makespan_lb2"] >= 1 - 1e-9


def test_simulate_partitioned_data_compares_the_hopping_policies_with_mop(profile, tmp_path, fleet_cli):
    done = fleet_cli("simulate", str(profile), "--gpus", "4,8", "--partitions", "2", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert ", 2 partitions" in done.stdout and "vs mop" in done.stdout and "vs base" not in done.stdout
    done = fleet_cli("simulate", str(profile), "--gpus", "8", "--partitions", "4", "--json", cwd=tmp_path)
    rows = {r["policy"]: r for r in json.loads(done.stdout)["rows"]}
    assert set(rows) == {"mop", "fleet-hop"} and rows["mop"]["speedup_mop"] == pytest.approx(1.0)
    # every model visits 4 partitions an epoch and hops after every visit but its last
    assert rows["mop"]["hops"] == sum(m["epochs"] * 4 - 1 for m in PROFILE["models"])
    assert rows["fleet-hop"]["makespan_lb2"] >= 1 - 1e-9
