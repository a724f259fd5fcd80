"""The spec's `scheduler` section: policy names from the registry, options from the policy's declaration."""


import pytest
import yaml

from fleet.prediction import predict
from fleet.schedule import POLICIES as REGISTRY
from fleet.schedule import paper100
from fleet.schedule.early_stop import EarlyStopSettings
from fleet.schedule.planners import FleetAdaptive, FleetGlobal, FleetLocal
from fleet.errors import UserError
from fleet.spec import EarlyStopSpec, SchedulerSpec, SpecError, parse_spec


def doc(**scheduler):
    return {"name": "t", "data": {"source": "digits"}, "models": [{"family": "mlp"}], "scheduler": scheduler}


def scheduler_error(**scheduler) -> str:
    with pytest.raises(SpecError) as err:
        parse_spec(doc(**scheduler))
    return str(err.value)


def test_policy_names_are_the_registrys():
    message = scheduler_error(policy="fleet-x")
    assert message == f"scheduler.policy: unknown policy 'fleet-x' (valid: auto, {', '.join(REGISTRY)})"
    for name, policy in REGISTRY.items():
        data = {"source": "hdf5", "path": "parts/", "partitioned": True} if policy.hops else {"source": "digits"}
        assert parse_spec({"name": "x", "data": data, "models": [{"family": "mlp"}],
                           "scheduler": {"policy": name}}, check_paths=False).scheduler.policy == name


def test_an_option_the_policy_does_not_take_names_the_field_and_the_policy():
    assert scheduler_error(policy="baseline", alpha=0.8) == (
        "scheduler.alpha: policy 'baseline' takes no such option (it takes none)")
    assert scheduler_error(policy="fleet-l", alpha=0.5, delta=2.0) == (
        "scheduler.alpha: policy 'fleet-l' takes no such option (its options: delta)")
    assert scheduler_error(policy="fleet-g", window=4).startswith("scheduler.window: policy 'fleet-g' takes no such")


def test_a_key_no_policy_takes_is_unknown_with_the_valid_keys():
    assert scheduler_error(alpah=0.5) == (
        "scheduler.alpah: unknown key (valid keys: early_stop, policy, profile, profile_batches, profile_timed)")
    assert scheduler_error(policy="fleet-g", alpah=0.5) == (
        "scheduler.alpah: unknown key (valid keys: alpha, delta, early_stop, policy, profile, profile_batches, "
        "profile_timed)")
    assert scheduler_error(policy="baseline", options={}).startswith("scheduler.options: unknown key")


def test_the_default_policy_auto_takes_no_options():
    assert parse_spec(doc()).scheduler.policy == "auto" and parse_spec(doc()).scheduler.options == {}
    assert scheduler_error(alpha=0.5) == (
        "scheduler.alpha: policy auto (the default) takes no options: name the policy they are for (e.g. policy: fleet-g)")
    with pytest.raises(ValueError, match="choose one first"):
        parse_spec(doc()).scheduler.create_policy(0)


def test_values_are_checked_by_the_policys_rules():
    assert scheduler_error(policy="fleet-g", alpha=0) == "scheduler.alpha: must be a number > 0 and <= 1, got 0"
    assert scheduler_error(policy="fleet-l", delta="fast") == "scheduler.delta: must be a number > 0, or null, got 'fast'"
    assert scheduler_error(policy="fleet-adaptive", window=0) == "scheduler.window: must be an integer >= 1, got 0"


def test_options_not_written_take_the_policys_defaults():
    assert parse_spec(doc(policy="fleet-g")).scheduler.options == {"alpha": 0.8, "delta": None}
    assert parse_spec(doc(policy="baseline")).scheduler.options == {}
    adaptive = parse_spec(doc(policy="fleet-adaptive", window=3)).scheduler
    assert adaptive.options["window"] == 3 and adaptive.options["target_factor"] == 1.7
    assert adaptive.options["match_tolerance"] == 0.10 and adaptive.options["extra_gpus"] == 2


def test_the_spec_builds_its_policy_with_its_options():
    spec = parse_spec(doc(policy="fleet-g", alpha=0.5, delta=7))
    policy = spec.scheduler.create_policy(spec.seed)
    assert isinstance(policy, FleetGlobal) and (policy.alpha, policy.delta) == (0.5, 7.0)
    local = parse_spec(doc(policy="fleet-l", delta=3)).scheduler.create_policy(0)
    assert isinstance(local, FleetLocal) and local.delta == 3.0
    adaptive = parse_spec(doc(policy="fleet-adaptive", window=2, extra_gpus=0)).scheduler.create_policy(0)
    assert isinstance(adaptive, FleetAdaptive) and (adaptive.matcher.window, adaptive.matcher.extra) == (2, 0)


def test_another_policy_by_name_takes_its_own_defaults():
    scheduler = parse_spec(doc(policy="fleet-g", alpha=0.5, delta=7)).scheduler
    assert scheduler.create_policy(0, "fleet-g").alpha == 0.5
    assert scheduler.create_policy(0, "fleet-l").delta is None
    assert type(scheduler.create_policy(0, "baseline")).__name__ == "Baseline"


def test_the_resolved_spec_writes_options_beside_the_policy_and_reads_back():
    spec = parse_spec(doc(policy="fleet-l", delta=3))
    written = yaml.safe_load(spec.to_yaml())["scheduler"]
    assert written == {"policy": "fleet-l", "delta": 3.0, "profile": "auto", "profile_batches": 48, "profile_timed": 20}
    assert parse_spec(yaml.safe_load(spec.to_yaml())) == spec


def test_the_python_api_takes_the_same_keys():
    assert SchedulerSpec(policy="fleet-g", alpha=0.6).options == {"alpha": 0.6, "delta": None}
    assert SchedulerSpec().options == {} and SchedulerSpec().policy == "auto"


def test_the_dry_runs_predictions_run_the_specs_policy_with_its_options():
    scenario = paper100(0).scenario(20)
    default = predict(parse_spec(doc(policy="fleet-g")), scenario, ("fleet-l",))
    low_alpha = predict(parse_spec(doc(policy="fleet-g", alpha=0.3, delta=None)), scenario, ("fleet-l",))
    assert low_alpha["fleet-g"].rounds < default["fleet-g"].rounds
    assert low_alpha["fleet-l"].makespan == default["fleet-l"].makespan  # another policy: its defaults


def test_a_run_directory_written_by_an_older_fleet_resumes_with_any_policy(tmp_path):
    """spec.yaml used to carry alpha and delta whatever the policy; only models and data must
    match on resume, so such a directory resumes under a policy that takes neither."""
    from fleet.runtime.control.setup import check_same_ensemble

    doc = {"name": "x", "data": {"source": "digits"}, "models": [{"family": "mlp"}],
           "scheduler": {"policy": "baseline"}}
    spec = parse_spec(doc)
    old = dict(doc, scheduler={"policy": "baseline", "alpha": 0.8, "delta": None})
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(old))
    check_same_ensemble(tmp_path, spec)  # no error
    other = dict(doc, models=[{"family": "cnn"}])
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(other))
    with pytest.raises(UserError, match="different ensemble"):
        check_same_ensemble(tmp_path, spec)


@pytest.mark.parametrize("value, expected", [("auto", "auto"), (True, True), (False, False)])
def test_profile_is_true_false_or_auto(value, expected):
    assert parse_spec(doc(profile=value)).scheduler.profile == expected


def test_profile_of_another_value_is_one_line_naming_the_choices():
    with pytest.raises(SpecError, match=r"^scheduler.profile: expected true, false or auto, got 'sometimes'$"):
        parse_spec(doc(profile="sometimes"))


# -- scheduler.early_stop -------------------------------------------------------------------

def test_a_spec_without_early_stop_is_written_as_before_and_runs_none():
    spec = parse_spec(doc(policy="fleet-l", delta=3))
    assert spec.scheduler.early_stop is None and "early_stop" not in spec.resolved()["scheduler"]
    assert "early_stop" not in spec.to_yaml()
    assert spec.early_stop_settings() == EarlyStopSettings("none", 10)


def test_early_stop_takes_a_method_name_alone_and_fills_in_the_models_metric():
    spec = parse_spec(doc(early_stop="asha"))
    section = spec.scheduler.early_stop
    assert (section.method, section.min_epochs, section.reduction, section.metric.value) == ("asha", 1, 3.0,
                                                                                            "val_accuracy")
    assert spec.early_stop_settings() == EarlyStopSettings("asha", 10)
    written = yaml.safe_load(spec.to_yaml())["scheduler"]["early_stop"]
    assert written == {"method": "asha", "min_epochs": 1, "reduction": 3.0, "metric": "val_accuracy"}
    assert parse_spec(yaml.safe_load(spec.to_yaml())) == spec


def test_early_stop_settings_come_from_the_section_and_the_largest_max_epochs():
    models = [{"family": "mlp"}, {"family": "mlp", "name": "long", "train": {"max_epochs": 27}}]
    spec = parse_spec({**doc(early_stop={"method": "hyperband", "brackets": 2, "reduction": 3}), "models": models})
    assert spec.early_stop_settings() == EarlyStopSettings("hyperband", 27, brackets=2)
    median = parse_spec(doc(early_stop={"method": "median", "grace_epochs": 2, "min_models": 3, "min_epochs": 2}))
    assert median.early_stop_settings() == EarlyStopSettings("median", 10, min_epochs=2, grace_epochs=2, min_models=3)
    assert parse_spec(yaml.safe_load(median.to_yaml())) == median


def test_early_stop_on_loss_when_every_model_stops_on_loss():
    loss = {"stop": {"metric": "val_loss"}}
    spec = parse_spec({**doc(early_stop={"method": "sha", "reduction": 2}), "train": loss})
    assert spec.scheduler.early_stop.metric.value == "val_loss"
    assert parse_spec({**doc(early_stop={"method": "sha", "reduction": 2, "metric": "val_loss"}), "train": loss}) == spec


def test_method_none_takes_models_on_any_metric():
    models = [{"family": "mlp"}, {"family": "mlp", "name": "b", "train": {"stop": {"metric": "val_loss"}}}]
    spec = parse_spec({**doc(early_stop={"method": "none", "min_epochs": 20}), "models": models})
    assert spec.early_stop_settings().method == "none"


def test_early_stop_errors_name_the_field():
    assert scheduler_error(early_stop={"method": "asha", "min_epochs": 10}) == (
        "scheduler.early_stop.min_epochs: must be below the largest train.max_epochs of the ensemble (10), got 10")
    assert scheduler_error(early_stop={"method": "asha", "brackets": 2}) == (
        "scheduler.early_stop.brackets: applies to method hyperband only (method: asha)")
    assert scheduler_error(early_stop={"method": "sh"}).startswith("scheduler.early_stop.method: unknown method 'sh'")


def test_the_python_api_takes_early_stop_too():
    scheduler = SchedulerSpec(policy="fleet-g", early_stop={"method": "sha", "reduction": 2})
    assert scheduler.early_stop == EarlyStopSpec(method="sha", reduction=2)
    assert EarlyStopSpec(method="sha", reduction=2).settings(8) == EarlyStopSettings("sha", 8, reduction=2)


def test_the_local_reference_run_refuses_early_stopping_in_one_line(tmp_path, fleet_cli):
    """`fleet run --local` trains every model to its end, one after another (the reference the
    MPI runtime is checked against): asked to stop models at rungs, it says so in one line
    instead of silently training them all."""
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump(doc(early_stop="asha")))
    done = fleet_cli("run", str(spec), "--local", "--run-dir", str(tmp_path / "run"), cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [
        "fleet run: error: scheduler.early_stop: fleet run --local trains every model to its end, one after another "
        "(the reference); early stopping needs the MPI run (leave out --local)"]
    assert fleet_cli("validate", str(spec), cwd=tmp_path).returncode == 0
