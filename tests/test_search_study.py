"""An adaptive search's study on a journal file, without MPI: ask, tell, prune, and a resume
that reuses a trial asked but never recorded and never asks a recorded model again."""

import pytest
from optuna.trial import TrialState

from fleet.runtime.control.search import SearchBook
from fleet.runtime.control.study import Study, distributions, values_of
from fleet.spec import parse_spec
from fleet.spec.asked import read_asked
from fleet.spec.search import Dimension

SPACE = {"hidden": {"choice": [[32], [64], [64, 64]]}, "train.lr": {"loguniform": [1e-4, 1e-1]},
         "dropout": {"uniform": [0.0, 0.4]}}


def spec_of(run_dir, budget=4):
    return parse_spec({"name": "t", "data": {"source": "digits"}, "run_dir": str(run_dir),
                       "models": [{"family": "mlp", "name": "s", "sampler": "tpe", "budget": budget,
                                   "search": SPACE}]}, check_paths=False)


def history(*accuracies):
    return [{"epoch": e, "val_accuracy": a, "val_loss": 1 - a} for e, a in enumerate(accuracies, start=1)]


def test_spaces_map_to_optuna_and_back():
    space = {k: Dimension.model_validate(v) for k, v in {**SPACE, "blocks": {"int": [1, 3], "size": 2}}.items()}
    dists = distributions(space)
    assert sorted(dists) == ["blocks[0]", "blocks[1]", "dropout", "hidden", "train.lr"]
    assert dists["train.lr"].log and not dists["dropout"].log
    params = {"hidden": '[64, 64]', "train.lr": 0.01, "dropout": 0.1, "blocks[0]": 2, "blocks[1]": 3}
    assert values_of(space, params) == {"hidden": [64, 64], "train.lr": 0.01, "dropout": 0.1, "blocks": [2, 3]}


def test_asks_are_recorded_and_a_resumed_book_never_asks_a_model_twice(tmp_path):
    book = SearchBook(tmp_path, spec_of(tmp_path))
    first = book.ask("s-000")
    assert first is not None and book.ask("s-000") is None
    book.ask("s-001")
    book.ended("s-000", history(0.5, 0.8, 0.7))
    book.stopped("s-001", history(0.3, 0.4), rung=1)
    resumed = SearchBook(tmp_path, spec_of(tmp_path))
    assert resumed.ask("s-000") is None and resumed.ask("s-001") is None
    assert resumed.spec.model("s-000") == first
    resumed.ask("s-002")
    records = read_asked(tmp_path)
    assert [records[m]["trial"] for m in ("s-000", "s-001", "s-002")] == [0, 1, 2]
    trials = resumed.studies["s"].study.get_trials()
    assert [t.state for t in trials] == [TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING]
    assert trials[0].value == pytest.approx(0.8)  # the best epoch's, not the last's
    assert trials[1].value == pytest.approx(0.3) and trials[1].intermediate_values == {1: pytest.approx(0.3)}


def test_a_trial_asked_but_never_recorded_is_the_next_models(tmp_path):
    spec = spec_of(tmp_path)
    slot = spec.model("s-000").search
    lost = Study(tmp_path / "search", "s", "tpe", slot.space, maximize=True, seed=0)
    number, values = lost.ask(claimed=())  # the job died here: nothing in asked.jsonl
    book = SearchBook(tmp_path, spec)
    book.ask("s-000")
    assert read_asked(tmp_path)["s-000"]["trial"] == number
    assert read_asked(tmp_path)["s-000"]["values"] == values
    assert len(book.studies["s"].study.get_trials()) == 1


def test_a_resumed_run_tells_what_ended_before_the_crash_once(tmp_path):
    book = SearchBook(tmp_path, spec_of(tmp_path))
    for model in ("s-000", "s-001"):
        book.ask(model)
    resumed = SearchBook(tmp_path, spec_of(tmp_path))
    resumed.catch_up({"s-000": history(0.6), "s-001": history(0.2, 0.1)}, {"s-001": 2})
    resumed.catch_up({"s-000": history(0.9)}, {})  # told already: no change
    trials = resumed.studies["s"].study.get_trials()
    assert [t.state for t in trials] == [TrialState.COMPLETE, TrialState.PRUNED]
    assert trials[0].value == pytest.approx(0.6)


def test_val_loss_is_minimized(tmp_path):
    spec = parse_spec({"name": "t", "data": {"source": "digits"}, "train": {"stop": {"metric": "val_loss"}},
                       "models": [{"family": "mlp", "name": "s", "sampler": "tpe", "budget": 2, "search": SPACE}]},
                      check_paths=False)
    book = SearchBook(tmp_path, spec)
    book.ask("s-000")
    book.ended("s-000", history(0.5, 0.9, 0.7))
    study = book.studies["s"].study
    assert study.direction.name == "MINIMIZE" and study.trials[0].value == pytest.approx(0.1)


def test_a_resumed_study_draws_new_values_not_the_first_jobs_again(tmp_path):
    book = SearchBook(tmp_path, spec_of(tmp_path))
    first = [book.ask(m).params for m in ("s-000", "s-001")]
    resumed = SearchBook(tmp_path, spec_of(tmp_path))
    later = [resumed.ask(m).params for m in ("s-002", "s-003")]
    assert not any(p in first for p in later)
