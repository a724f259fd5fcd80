"""An adaptive search's study on a journal file, without MPI: ask, tell, prune, and a resume
that reuses a trial asked but never recorded and never asks a recorded model again."""

import pytest
from optuna.trial import TrialState

from fleet.runtime.control.search import SearchBook
from fleet.runtime.control.study import Study, distributions, drawn_at_random, random_params, values_of
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


def test_under_early_stopping_a_share_of_trials_is_drawn_at_random_and_a_crash_keeps_the_draw(tmp_path):
    """With `random_share`, the trials `drawn_at_random` picks take `random_params` (not the
    sampler's), the others the sampler's; a draw enqueued before a crash is the next trial's."""
    slot = spec_of(tmp_path).model("s-000").search
    fixed = distributions(slot.space)
    study = Study(tmp_path / "search", "s", "tpe", slot.space, maximize=True, seed=5, random_share=0.5)
    picked = [drawn_at_random(5, n, 0.5) for n in range(12)]
    assert 3 <= sum(picked) <= 9  # about half
    for number in range(12):
        asked, values = study.ask(claimed=range(number))
        assert asked == number
        trial = study.study.get_trials()[number]
        assert (trial.params == random_params(fixed, 5, number)) is picked[number]
        study.tell(number, 0.1 * (number % 4))
    study.study.enqueue_trial(random_params(fixed, 5, 99))  # the job died between the draw and the ask
    again = Study(tmp_path / "search", "s", "tpe", slot.space, maximize=True, seed=5, random_share=0.5)
    number, _ = again.ask(claimed=range(12))
    assert number == 12 and again.study.get_trials()[12].params == random_params(fixed, 5, 99)
    assert len(again.study.get_trials()) == 13
    assert not any(drawn_at_random(5, n, 0.0) for n in range(12))


def test_a_search_book_draws_at_random_only_where_early_stopping_prunes(tmp_path):
    plain = SearchBook(tmp_path / "a", spec_of(tmp_path / "a"))
    plain.ask("s-000")
    assert plain.studies["s"].random_share == 0
    pruned = parse_spec({"name": "t", "data": {"source": "digits"}, "run_dir": str(tmp_path / "b"),
                         "scheduler": {"early_stop": "asha"},
                         "models": [{"family": "mlp", "name": "s", "sampler": "tpe", "budget": 4, "search": SPACE}]},
                        check_paths=False)
    book = SearchBook(tmp_path / "b", pruned)
    book.ask("s-000")
    assert book.studies["s"].random_share == pytest.approx(1 / 3)
