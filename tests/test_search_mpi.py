"""An adaptive search under a real mpiexec: sampler tpe, budget 6, on 2 CPU trainers over the
digits data, with the checkpoint signal (a requeue) in the middle. It ends with exactly its
budget of models, each asked once (its study's journal holds 6 complete trials, asked.jsonl a
line per model with distinct trials) and trained with the values it was asked."""

import json

import optuna
import pytest
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState

from test_early_stop_mpi import start_and_signal
from test_runtime_mpi import epochs_by_model, events, results, write_spec

pytestmark = [pytest.mark.mpi, pytest.mark.slow]

BUDGET = 6
IDS = [f"s-{k:03d}" for k in range(BUDGET)]


def test_a_tpe_search_requeued_midway_asks_each_model_once(tmp_path):
    search = {"family": "mlp", "name": "s", "sampler": "tpe", "budget": BUDGET,
              "search": {"hidden": {"choice": [[16], [32], [64]]}, "train.lr": {"loguniform": [0.01, 0.3]}}}
    spec = write_spec(tmp_path / "s.yaml", [search],
                      {"nodes": 1, "gpus_per_node": 2, "preprocessors_per_node": 1, "device": "cpu"}, "fleet-l",
                      train={"batch_size": 32, "max_epochs": 2})
    run_dir = tmp_path / "run"
    codes = [start_and_signal(spec, run_dir, 3, 3)]
    while codes[-1] != 0 and len(codes) < 6:
        codes.append(start_and_signal(spec, run_dir, 3, 4))
    assert codes[-1] == 0 and 75 in codes, codes

    asked = [json.loads(line) for line in (run_dir / "search" / "asked.jsonl").read_text().splitlines()]
    assert sorted(r["model"] for r in asked) == IDS
    assert sorted(r["trial"] for r in asked) == list(range(BUDGET)), "a trial was asked twice or lost"
    storage = JournalStorage(JournalFileBackend(str(run_dir / "search" / "s.journal")))
    trials = optuna.load_study(study_name="s", storage=storage).get_trials()
    assert len(trials) == BUDGET and all(t.state is TrialState.COMPLETE for t in trials)

    final = {m["id"]: m for m in results(run_dir)["models"]}
    assert sorted(final) == IDS and all(m["converged"] for m in final.values())
    best = {r["model"]: max(h["val_accuracy"] for h in final[r["model"]]["history"]) for r in asked}
    assert {r["trial"]: pytest.approx(best[r["model"]]) for r in asked} == {t.number: t.value for t in trials}
    assert all(e == sorted(set(e)) for e in epochs_by_model(run_dir).values()), "an epoch trained twice"
    logged = [e for e in events(run_dir) if e["event"] == "asked"]
    assert sorted(e["model"] for e in logged) == IDS
    # planned at the asked width's rates: the placeholder's ([32], the middle) times FLOPs [32] / asked
    width = {r["model"]: r["values"]["hidden"][0] for r in asked}
    factors = {e["model"]: e["rate_factor"] for e in logged}
    assert all((factors[m] > 1.5, factors[m] == 1.0, factors[m] < 0.7)[(16, 32, 64).index(width[m])] for m in IDS), \
        (factors, width)
    trained = {e["model"]: e for e in events(run_dir) if e["event"] == "member_start"}
    assert set(trained) == set(IDS)
    hidden = {r["model"]: r["values"]["hidden"][0] for r in asked}
    built = {(e["model"], e["parameters"]) for e in events(run_dir) if e["event"] == "member_left"}
    assert {m for m, _ in built} == set(IDS)
    assert all(n == 64 * hidden[m] + hidden[m] + hidden[m] * 10 + 10 for m, n in built), (built, hidden)
