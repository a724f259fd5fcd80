"""An adaptive search over groups under a real mpiexec (issues 47 and 48): sampler tpe, budget 3,
on a synthetic data set of 4 groups, policy grouped, early stopping asha, with the checkpoint
signal (a requeue) in the middle. Each group has a study of its own: it ends with exactly its
budget of models, each asked once by its group's study, every trial told, and each asked model
trained on its group's samples with the values it was asked."""

import json

import optuna
import pytest
import yaml
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState

from preprocess.grouped import unique_parts
from test_early_stop_mpi import start_and_signal
from test_grouped_run_mpi import group_splits, grouped_spec
from test_runtime_mpi import epochs_by_model, events, results

pytestmark = [pytest.mark.mpi, pytest.mark.slow]

BUDGET = 3


def test_a_tpe_search_over_groups_asks_each_groups_budget_from_its_own_study(tmp_path):
    search = {"family": "mlp", "name": "s", "sampler": "tpe", "budget": BUDGET,
              "search": {"hidden": {"choice": [[8], [16], [32]]}, "train.lr": {"loguniform": [0.01, 0.3]}}}
    spec, data = grouped_spec(tmp_path, 960, [search], max_epochs=4, policy="grouped")
    doc = yaml.safe_load(spec.read_text())
    doc["scheduler"]["early_stop"] = {"method": "asha", "min_epochs": 1, "reduction": 2}
    spec.write_text(yaml.safe_dump(doc))
    run_dir = tmp_path / "run"
    codes = [start_and_signal(spec, run_dir, 3, 4)]
    while codes[-1] != 0 and len(codes) < 6:
        codes.append(start_and_signal(spec, run_dir, 3, 6))
    assert codes[-1] == 0 and 75 in codes, codes

    parts = unique_parts(sorted(group_splits(data)))
    final = {m["id"]: m for m in results(run_dir)["models"]}
    asked = [json.loads(line) for line in (run_dir / "search" / "asked.jsonl").read_text().splitlines()]
    assert sorted(r["model"] for r in asked) == sorted(final), "a model was asked twice, or not at all"
    for key, part in parts.items():
        study = f"s-{part}"
        ids = [f"s-{k:03d}-{part}" for k in range(BUDGET)]
        mine = [r for r in asked if r["study"] == study]
        assert sorted(r["model"] for r in mine) == ids, (study, mine)
        assert sorted(r["trial"] for r in mine) == list(range(BUDGET)), f"{study}: a trial asked twice or lost"
        storage = JournalStorage(JournalFileBackend(str(run_dir / "search" / f"{study}.journal")))
        trials = optuna.load_study(study_name=study, storage=storage).get_trials()
        assert len(trials) == BUDGET and all(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in trials)
        assert all(final[m]["converged"] for m in ids)
        assert {final[m].get("group", key) for m in ids} == {key}
    assert all(e == sorted(set(e)) for e in epochs_by_model(run_dir).values()), "an epoch trained twice"
    # each asked model was built with the width its group's study asked
    hidden = {r["model"]: r["values"]["hidden"][0] for r in asked}
    built = {e["model"]: e["parameters"] for e in events(run_dir) if e["event"] == "member_left"}
    assert set(built) == set(hidden)
    pixels = 16 * 16 * 3
    assert all(built[m] == pixels * h + h + h * 4 + 4 for m, h in hidden.items()), (built, hidden)
