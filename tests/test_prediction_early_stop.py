"""The dry run's prediction with early stopping (pure: the simulator, no profiling)."""

from fleet.prediction import _scenario, early_stop_lines, predict
from fleet.schedule import ModelProfile, RateTable
from fleet.spec import parse_spec


def sweep_spec(early_stop):
    return parse_spec({
        "name": "x", "data": {"source": "digits"},
        "models": [{"family": "mlp", "search": {"train.lr": {"choice": [0.001 * k for k in range(1, 17)]}}}],
        "train": {"max_epochs": 8, "stop": {"patience": 8}},
        "scheduler": {"policy": "fleet-g", "early_stop": early_stop},
        "cluster": {"nodes": 1, "gpus_per_node": 4, "device": "cpu"},
    }, check_paths=False)


def test_the_dry_run_predicts_early_stopping_beside_the_run_without_it_and_says_what_it_rests_on():
    spec = sweep_spec({"method": "asha", "reduction": 2})
    rates = RateTable(tuple(ModelProfile(m.id, (100.0, 180.0)) for m in spec.models), 4, 100)
    scenario = _scenario(rates, spec, 4)
    result = predict(spec, scenario, policies=())["fleet-g"]  # a run stops models at rungs: so does its prediction
    assert sum(result.epochs_trained) < 64
    lines = early_stop_lines(spec, scenario, "fleet-g", result)
    text = "\n".join(lines)
    assert "early stopping (asha, rungs at 1, 2, 4 epochs, keeping 1 in 2)" in text and "not which" in text
    rows = {line.split("  ")[0]: line.split() for line in lines[2].splitlines()[2:]}
    with_es, none = rows["fleet-g, early stopping asha"], rows["fleet-g, none"]
    assert none[-2] == "128" and int(with_es[-2]) < 64  # model-epochs: 16 models x 8, and far fewer


def test_no_early_stopping_adds_nothing_to_the_dry_run():
    spec = sweep_spec("none")
    assert early_stop_lines(spec, None, "fleet-g", None) == []
