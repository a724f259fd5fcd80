"""Early stopping's records in the run directory, and a resumed run's early stopping (pure: no MPI)."""

import json

import pytest

from fleet.errors import UserError
from fleet.runtime.control.rungs import RungLog, check_recorded_setting, resume_early_stopping, start_early_stopping
from fleet.schedule import ModelState
from fleet.schedule.early_stop import EarlyStopSettings, Verdict, create_early_stopping
from fleet.schedule.ledger import Ledger
from fleet.schedule.rates import ModelProfile, RateTable

MODELS = ["a", "b", "c", "d"]


def settings(method="sha", **kw):
    return EarlyStopSettings(method, max_epochs=4, min_epochs=1, reduction=2, **kw)


def curve(*accuracies):
    return [{"epoch": e, "val_accuracy": a, "val_loss": 1 - a} for e, a in enumerate(accuracies, start=1)]


def test_the_log_keeps_decisions_in_order_with_their_rung_index_and_time(tmp_path):
    early = create_early_stopping(settings("asha"), MODELS)
    log = RungLog(tmp_path, early)
    made = early.epoch_ended("a", 1, -0.5) + early.epoch_ended("b", 1, -0.4)
    records = log.append(made, 12.34567)
    assert [r["index"] for r in records] == [0, 0] and records[0]["at"] == 12.346
    assert [d.to_record() for d in log.read()] == [d.to_record() for d in made]


def test_a_line_torn_by_a_crash_is_left_out_and_a_bad_line_before_it_is_an_error(tmp_path):
    early = create_early_stopping(settings("asha"), MODELS)
    log = RungLog(tmp_path, early)
    log.append(early.epoch_ended("a", 1, -0.5), 1.0)
    with open(log.path, "a") as out:
        out.write('{"model": "b", "rung": 1, "verd')
    assert [d.model for d in log.read()] == ["a"]
    log.path.write_text('{"model": "a", "rung": 1}\n' + log.path.read_text())
    with pytest.raises(UserError, match=r"rungs.jsonl: line 1: rung decision record: verdict: missing"):
        log.read()


def test_the_setting_is_kept_and_a_different_one_refused_in_one_line(tmp_path):
    assert not check_recorded_setting(tmp_path, settings())
    RungLog.check_setting(tmp_path, settings())
    assert json.loads((tmp_path / "early_stop.json").read_text())["method"] == "sha"
    assert check_recorded_setting(tmp_path, settings())
    with pytest.raises(UserError) as error:
        check_recorded_setting(tmp_path, EarlyStopSettings("sha", max_epochs=4, min_epochs=1, reduction=3))
    assert "\n" not in str(error.value) and "reduction 3" in str(error.value) and "early_stop.json" in str(error.value)
    with pytest.raises(UserError, match="differs"):  # no early stopping now, where the run started with it
        start_early_stopping(tmp_path, EarlyStopSettings("none", max_epochs=4), MODELS, "val_accuracy", {}, {})


def test_a_resumed_sha_run_holds_who_waited_and_decides_a_rung_reached_without_a_decision(tmp_path):
    """a, b, c paused at rung 1 (recorded); d reached it too, but the job ended before its
    decision was recorded: on resume d is decided, which fills the rung: the best half is
    promoted, the rest stopped, and all of it is in the log before anything acts."""
    early = create_early_stopping(settings(), MODELS)
    log = RungLog(tmp_path, early)
    log.append([d for m, acc in (("a", 0.5), ("b", 0.9), ("c", 0.7)) for d in early.epoch_ended(m, 1, -acc)], 3.0)
    curves = {"a": curve(0.5), "b": curve(0.9), "c": curve(0.7), "d": curve(0.8)}
    resumed = resume_early_stopping(RungLog(tmp_path, create_early_stopping(settings(), MODELS)), "val_accuracy",
                                    curves, {})
    verdicts = {(d.model, d.verdict) for d in resumed.made}
    assert verdicts == {("d", Verdict.PAUSED), ("b", Verdict.PROMOTED), ("d", Verdict.PROMOTED),
                        ("a", Verdict.STOPPED), ("c", Verdict.STOPPED)}
    assert resumed.stopped == {"a", "c"} and resumed.held == frozenset()
    assert [d.seq for d in RungLog(tmp_path, resumed.early).read()] == list(range(8))


def test_models_paused_at_an_unfilled_rung_come_back_held_and_an_asha_decision_is_not_made_twice(tmp_path):
    early = create_early_stopping(settings(), MODELS)
    RungLog(tmp_path, early).append(early.epoch_ended("a", 1, -0.5) + early.epoch_ended("b", 1, -0.6), 1.0)
    resumed = resume_early_stopping(RungLog(tmp_path, create_early_stopping(settings(), MODELS)), "val_accuracy",
                                    {"a": curve(0.5), "b": curve(0.6)}, {})
    assert resumed.made == () and resumed.held == {"a", "b"} and resumed.stopped == frozenset()
    rates = RateTable(tuple(ModelProfile(m, (100.0,)) for m in MODELS), 2, 100)
    ledger = Ledger(rates, [4.0] * 4, 2, 2, {"a": 1, "b": 1}, paused=["a", "b"], held=resumed.held)
    assert [ledger.model(m).state for m in MODELS] == [ModelState.HELD] * 2 + [ModelState.PENDING] * 2

    asha_dir = tmp_path / "asha"
    asha_dir.mkdir()
    early = create_early_stopping(settings("asha"), MODELS)
    RungLog(asha_dir, early).append(early.epoch_ended("a", 1, -0.5), 1.0)
    resumed = resume_early_stopping(RungLog(asha_dir, create_early_stopping(settings("asha"), MODELS)),
                                    "val_loss", {"a": curve(0.5)}, {})
    assert resumed.made == ()  # a's rung-1 decision is on record: not made again
