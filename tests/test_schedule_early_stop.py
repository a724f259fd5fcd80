"""Early stopping across models (fleet.schedule.early_stop): the rung arithmetic of every
method on hand-checkable cases, restoring from records, and properties over any arrival order.

Metrics are lower-is-better throughout (the driver passes ``-val_accuracy`` or ``val_loss``).
"""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.schedule.early_stop import (
    METHODS,
    EarlyStopError,
    EarlyStopSettings,
    RecordError,
    RungDecision,
    Verdict,
    create_early_stopping,
    hyperband_brackets,
    rung_epochs,
    surviving_share,
)
from fleet.schedule.early_stop.rungs import deal

C, S, P, PR = Verdict.CONTINUE, Verdict.STOPPED, Verdict.PAUSED, Verdict.PROMOTED


def stopping(method: str, models, max_epochs: int, **options):
    return create_early_stopping(EarlyStopSettings(method, max_epochs, **options), list(models))


def brief(decisions) -> list[tuple]:
    """(model, rung, verdict, cutoff) of each decision."""
    return [(d.model, d.rung, d.verdict, d.cutoff) for d in decisions]


# -- settings and rungs --------------------------------------------------------------------

def test_rungs_lie_at_min_epochs_times_powers_of_eta_below_max_epochs():
    assert rung_epochs(1, 3, 81) == (1, 3, 9, 27)
    assert rung_epochs(2, 2, 20) == (2, 4, 8, 16)
    assert rung_epochs(1, 1.5, 6) == (1, 2, 3, 5)  # 1, 1.5, 2.25, 3.375, 5.06: rounded, distinct
    assert rung_epochs(1, 2, 8) == (1, 2, 4)
    assert rung_epochs(4, 3, 5) == (4,) and rung_epochs(5, 3, 5) == ()
    asha = stopping("asha", "ab", 8, reduction=2)
    assert asha.rungs("a") == (1, 2, 4)
    assert [asha.next_stop("a", done) for done in (0, 1, 3, 4, 7)] == [1, 2, 4, None, None]


def test_settings_defaults_and_resolved_values():
    s = EarlyStopSettings("hyperband", 81)
    assert (s.min_epochs, s.reduction, s.brackets, s.grace_epochs, s.min_models, s.s_max) == (1, 3.0, 5, 1, 5, 4)
    assert EarlyStopSettings("median", 10, min_epochs=3).grace_epochs == 3
    assert EarlyStopSettings("asha", 10).brackets is None
    assert EarlyStopSettings("none", 1).method == "none"  # none needs no room for a rung


@pytest.mark.parametrize("options, field, text", [
    ({"method": "ashaa"}, "method", "unknown method 'ashaa' (valid: none, asha, sha, hyperband, median)"),
    ({"max_epochs": 0}, "max_epochs", "must be an integer >= 1, got 0"),
    ({"min_epochs": 0}, "min_epochs", "must be an integer >= 1, got 0"),
    ({"min_epochs": 8}, "min_epochs", "must be below the largest train.max_epochs of the ensemble (8), got 8"),
    ({"reduction": 1}, "reduction", "must be a number > 1, got 1"),
    ({"reduction": True}, "reduction", "must be a number > 1, got True"),
    ({"reduction": math.inf}, "reduction", "must be a number > 1, got inf"),
    ({"grace_epochs": -1}, "grace_epochs", "must be an integer >= 0, got -1"),
    ({"min_models": 0}, "min_models", "must be an integer >= 1, got 0"),
    ({"brackets": 2}, "brackets", "applies to method hyperband only (method: asha)"),
    ({"method": "hyperband", "brackets": 5}, "brackets", "must be an integer from 1 to 2 (s_max + 1 for min_epochs 1"),
    ({"method": "hyperband", "brackets": 0}, "brackets", "must be an integer from 1 to 2"),
])
def test_each_bad_setting_is_one_line_naming_its_field(options, field, text):
    with pytest.raises(EarlyStopError) as err:
        EarlyStopSettings(**{"method": "asha", "max_epochs": 8, **options})
    assert err.value.field == field and str(err.value).startswith(f"{field}: {text}")
    assert "\n" not in str(err.value) and isinstance(err.value, ValueError)


def test_the_registry_names_every_method():
    assert list(METHODS) == ["none", "asha", "sha", "hyperband", "median"]
    for name in METHODS:
        assert type(stopping(name, "ab", 9)) is METHODS[name]


# -- asha ------------------------------------------------------------------------------------

def test_asha_continues_the_top_fraction_of_the_arrivals_so_far():
    """η = 2, rung 1: a (.5) first, fewer than η: on; b (.3) of 2, k = 1, best: on; c (.4) of
    3, k = 1: stopped below b; d (.6) of 4, k = 2, cut-off c's .4: stopped; e (.35) of 5, k = 2:
    second best: on, the cut-off its own value."""
    asha = stopping("asha", "abcdef", 8, reduction=2)
    made = [asha.epoch_ended(m, 1, v) for m, v in zip("abcde", (0.5, 0.3, 0.4, 0.6, 0.35))]
    assert [brief(d) for d in made] == [[("a", 1, C, None)], [("b", 1, C, 0.3)], [("c", 1, S, 0.3)],
                                        [("d", 1, S, 0.4)], [("e", 1, C, 0.35)]]
    assert [d.seq for d in asha.decisions] == [0, 1, 2, 3, 4]
    assert brief(asha.epoch_ended("a", 2, 0.2)) == [("a", 2, C, None)]  # first at rung 2
    assert asha.stopped() == ["c", "d"] and asha.paused() == []


def test_asha_decides_only_at_rungs_and_once_per_rung():
    asha = stopping("asha", "ab", 8, reduction=2)
    assert asha.epoch_ended("a", 3, 0.1) == []  # 3 is no rung (1, 2, 4)
    assert brief(asha.epoch_ended("a", 4, 0.1)) == [("a", 4, C, None)]
    assert asha.epoch_ended("a", 4, 0.1) == []  # the epoch trained again after a requeue
    assert asha.model_ended("a", 5) == []


def test_asha_ties_go_to_the_earlier_arrival():
    asha = stopping("asha", "abc", 8, reduction=2)
    asha.epoch_ended("a", 1, 0.5)
    assert brief(asha.epoch_ended("b", 1, 0.5)) == [("b", 1, S, 0.5)]
    asha = stopping("asha", "abc", 8, reduction=2)
    asha.epoch_ended("b", 1, 0.5)
    assert brief(asha.epoch_ended("a", 1, 0.5)) == [("a", 1, S, 0.5)]


def test_a_missing_or_infinite_metric_ranks_last_and_is_kept_as_none():
    asha = stopping("asha", "abc", 8, reduction=2)
    asha.epoch_ended("a", 1, float("nan"))
    decision = asha.epoch_ended("b", 1, 0.9)[0]
    assert decision.verdict is C and decision.cutoff == 0.9 and asha.decisions[0].metric is None


# -- sha ---------------------------------------------------------------------------------------

def test_sha_with_9_models_pauses_then_promotes_3_at_rung_1_and_1_at_rung_3():
    models = [f"m{i}" for i in range(9)]
    sha = stopping("sha", models, 10)  # rungs 1, 3, 9
    values = dict(zip(models, (0.7, 0.2, 0.9, 0.4, 0.1, 0.8, 0.6, 0.3, 0.5)))
    for m in models[:8]:
        assert brief(sha.epoch_ended(m, 1, values[m])) == [(m, 1, P, None)]
    assert sha.paused() == models[:8]
    last = sha.epoch_ended("m8", 1, values["m8"])
    assert brief(last[:1]) == [("m8", 1, P, None)]
    assert {d.model for d in last if d.verdict is PR} == {"m4", "m1", "m7"}  # .1, .2, .3
    assert all(d.cutoff == 0.3 for d in last[1:]) and len(last) == 10 and sha.paused() == []
    assert [d.model for d in last[1:]] == models  # in arrival order
    for m in ("m4", "m1", "m7"):
        assert sha.epoch_ended(m, 2, 0.0) == []
    sha.epoch_ended("m7", 3, 0.05)
    sha.epoch_ended("m4", 3, 0.2)
    assert sha.paused() == ["m4", "m7"]
    done = sha.epoch_ended("m1", 3, 0.1)
    assert brief(done) == [("m1", 3, P, None), ("m7", 3, PR, 0.05), ("m4", 3, S, 0.05), ("m1", 3, S, 0.05)]
    assert brief(sha.epoch_ended("m7", 9, 0.01)) == [("m7", 9, P, None), ("m7", 9, PR, 0.01)]
    assert sha.next_stop("m7", 9) is None  # promoted from the last rung: trains to max_epochs
    assert len(sha.stopped()) == 8


def test_sha_does_not_wait_for_a_model_that_ended_on_its_own():
    sha = stopping("sha", "abcd", 10, min_epochs=2, reduction=2)  # rungs 2, 4, 8
    assert sha.model_ended("d", 1) == []  # diverged in its first epoch
    sha.epoch_ended("a", 2, 0.3)
    sha.epoch_ended("b", 2, 0.1)
    made = sha.epoch_ended("c", 2, 0.2)  # three reported, max(1, floor(3 / 2)) = 1 promoted
    assert brief(made) == [("c", 2, P, None), ("a", 2, S, 0.1), ("b", 2, PR, 0.1), ("c", 2, S, 0.1)]


def test_sha_a_paused_model_that_ends_is_withdrawn_and_the_ending_may_fill_the_rung():
    sha = stopping("sha", "abcd", 10, min_epochs=2, reduction=2)
    for m, v in zip("abc", (0.1, 0.2, 0.3)):
        sha.epoch_ended(m, 2, v)
    sha.model_ended("a", 2)  # its own stop rule fired at the rung: not promoted, not counted
    assert sha.paused() == ["b", "c"]
    made = sha.model_ended("d", 1)
    assert brief(made) == [("b", 2, PR, 0.2), ("c", 2, S, 0.2)]
    assert sha.model_ended("d", 1) == [] and sha.model_ended("c", 2) == []


def test_sha_waits_for_models_not_started_yet():
    sha = stopping("sha", "abc", 10)
    sha.epoch_ended("a", 1, 0.1)
    sha.epoch_ended("b", 1, 0.2)
    assert sha.paused() == ["a", "b"] and sha.next_stop("c", 0) == 1


# -- hyperband ------------------------------------------------------------------------------

def test_hyperband_brackets_match_li_et_al_for_81_epochs_and_eta_3():
    """Li et al. 2018, Table 1 (R = 81, η = 3): s = 4..0 start n = 81, 34, 15, 8, 5 models at
    r = 1, 3, 9, 27, 81 epochs; here bracket b = s_max - s, first rung 1 × 3^b."""
    plans = hyperband_brackets(EarlyStopSettings("hyperband", 81))
    assert [(p.index, p.first_rung, p.size) for p in plans] == [(0, 1, 81), (1, 3, 34), (2, 9, 15), (3, 27, 8),
                                                                  (4, 81, 5)]
    assert [p.rungs for p in plans] == [(1, 3, 9, 27), (3, 9, 27), (9, 27), (27,), ()]
    assert [p.index for p in hyperband_brackets(EarlyStopSettings("hyperband", 81, brackets=2))] == [0, 1]


def test_hyperband_deals_models_in_spec_order_to_li_et_als_bracket_sizes():
    dealt = deal(143, [81, 34, 15, 8, 5])
    assert [dealt.count(b) for b in range(5)] == [81, 34, 15, 8, 5]
    assert deal(6, [1, 1, 1]) == (0, 1, 2, 0, 1, 2)  # equal weights: plain round-robin
    models = [f"m{i:03d}" for i in range(143)]
    hb = stopping("hyperband", models, 81)
    assert [sum(hb.bracket(m) == b for m in models) for b in range(5)] == [81, 34, 15, 8, 5]
    first = models[0]
    assert hb.bracket(first) == 0 and hb.rungs(first) == (1, 3, 9, 27)


def test_hyperband_halves_each_bracket_on_its_own_as_li_et_al_count():
    """Bracket 0 of 81 models: 81 -> 27 -> 9 -> 3 -> 1 past rungs 1, 3, 9, 27 (Li et al.'s
    n_i); bracket 1 of 34: 34 -> 11 -> 3 -> 1; bracket 2 of 15: 15 -> 5 -> 1; bracket 3 of 8:
    8 -> 2; bracket 4's 5 models meet no rung."""
    models = [f"m{i:03d}" for i in range(143)]
    decisions = Driver(stopping("hyperband", models, 81), curve, {m: 81 for m in models}).run([0])
    promoted: dict[tuple[int, int], int] = {}
    for d in decisions:
        if d.verdict is PR:
            promoted[d.bracket, d.rung] = promoted.get((d.bracket, d.rung), 0) + 1
    assert promoted == {(0, 1): 27, (0, 3): 9, (0, 9): 3, (0, 27): 1, (1, 3): 11, (1, 9): 3, (1, 27): 1,
                        (2, 9): 5, (2, 27): 1, (3, 27): 2}
    assert not any(d.bracket == 4 for d in decisions)


# -- median ------------------------------------------------------------------------------------

def test_median_stops_a_best_so_far_worse_than_the_others_median_after_grace():
    med = stopping("median", "abcde", 10, grace_epochs=2, min_models=2)
    for m, v in zip("abcd", (0.6, 0.6, 1.0, 0.3)):
        assert med.epoch_ended(m, 1, v) == []  # within the grace epochs
    assert med.epoch_ended("a", 2, 0.5) == []  # no other model has reported epoch 2
    assert med.epoch_ended("b", 2, 0.4) == []  # one other: fewer than min_models
    assert brief(med.epoch_ended("c", 2, 0.9)) == [("c", 2, S, 0.45)]  # best .9 > median(.5, .4)
    assert med.decisions[0].metric == 0.9
    assert med.epoch_ended("d", 2, 0.8) == []  # best so far .3 (epoch 1) < median(.5, .4, .9) = .5
    assert med.epoch_ended("c", 3, 0.1) == []  # stopped: no more decisions
    assert med.rungs("a") == tuple(range(2, 10)) and med.next_stop("a", 0) == 2 and med.next_stop("a", 9) is None


def test_median_without_enough_others_decides_nothing():
    med = stopping("median", "abcdef", 10)  # min_models 5
    for m, v in zip("abcde", (0.1, 0.2, 0.3, 0.4, 0.5)):
        assert med.epoch_ended(m, 1, v) == []
    assert brief(med.epoch_ended("f", 1, 0.9)) == [("f", 1, S, 0.3)]


def test_none_never_decides():
    none = stopping("none", "ab", 10)
    assert none.epoch_ended("a", 1, 0.5) == [] and none.rungs("a") == () and none.next_stop("a", 0) is None
    assert none.model_ended("a", 3) == [] and none.decisions == ()
    assert stopping("none", "ab", 10).restore([], ended={"a": 3}) == []


# -- records and restore ----------------------------------------------------------------------

def test_a_record_is_json_safe_and_reads_back():
    decision = RungDecision("m1", 3, PR, 0.25, 0.3, bracket=1, seq=7)
    record = json.loads(json.dumps(decision.to_record(), allow_nan=False))
    assert record == {"model": "m1", "rung": 3, "verdict": "promoted", "metric": 0.25, "cutoff": 0.3,
                      "bracket": 1, "seq": 7}
    assert RungDecision.from_record(record) == decision
    assert RungDecision.from_record({**record, "event": "rung"}) == decision  # an event line's extra keys


@pytest.mark.parametrize("change, field", [
    ({"model": ""}, "model"), ({"rung": 0}, "rung"), ({"rung": True}, "rung"), ({"verdict": "kept"}, "verdict"),
    ({"metric": "0.3"}, "metric"), ({"metric": math.nan}, "metric"), ({"cutoff": [1]}, "cutoff"),
    ({"bracket": -1}, "bracket"), ({"seq": 1.5}, "seq"),
])
def test_a_malformed_record_is_one_line_naming_its_field(change, field):
    record = {**RungDecision("m1", 3, S, 0.25, 0.3).to_record(), **change}
    with pytest.raises(RecordError) as err:
        RungDecision.from_record(record)
    assert err.value.field == field and str(err.value).startswith(f"rung decision record: {field}: ")
    assert "\n" not in str(err.value)


def test_a_record_missing_a_field_names_it():
    record = RungDecision("m1", 3, S, 0.25, 0.3).to_record()
    for field in record:
        with pytest.raises(RecordError, match=f"^rung decision record: {field}: missing$"):
            RungDecision.from_record({k: v for k, v in record.items() if k != field})
    with pytest.raises(RecordError, match="^rung decision record: record: expected a mapping, got list$"):
        RungDecision.from_record([1, 2])


def test_restore_refuses_records_that_do_not_fit_the_run():
    sha = stopping("sha", "ab", 10)
    with pytest.raises(RecordError, match="^rung decision record: seq: expected 0"):
        stopping("sha", "ab", 10).restore([RungDecision("a", 1, P, 0.1, None, seq=1)])
    with pytest.raises(RecordError, match="model: 'z' is not in the ensemble"):
        sha.restore([RungDecision("z", 1, P, 0.1, None)])
    with pytest.raises(RecordError, match="verdict: 'continue' is no decision of method 'sha'"):
        stopping("sha", "ab", 10).restore([RungDecision("a", 1, C, 0.1, None)])
    with pytest.raises(RecordError, match="rung: 2 is no rung of model 'a'"):
        stopping("sha", "ab", 10).restore([RungDecision("a", 2, P, 0.1, None)])
    with pytest.raises(RecordError, match="verdict: model 'a' cannot pause at rung 3 here"):
        stopping("sha", "ab", 10).restore([RungDecision("a", 3, P, 0.1, None)])  # not promoted at rung 1
    with pytest.raises(RecordError, match="model: 'a' was stopped by an earlier record"):
        stopping("asha", "ab", 10, reduction=2).restore([RungDecision("a", 1, S, 0.1, 0.0),
                                                          RungDecision("a", 2, C, 0.1, None, seq=1)])
    with pytest.raises(RecordError, match="verdict: model 'a' was not waiting at rung 1"):
        stopping("sha", "ab", 10).restore([RungDecision("a", 1, PR, 0.1, None)])
    with pytest.raises(RecordError, match="rung: model 'a' was decided at rung 1 already"):
        twice = [RungDecision("a", 1, C, 0.1, None), RungDecision("a", 1, C, 0.1, None, seq=1)]
        stopping("asha", "ab", 10).restore(twice)
    with pytest.raises(ValueError, match="fresh"):
        used = stopping("asha", "ab", 10)
        used.epoch_ended("a", 1, 0.1)
        used.restore([])


class Driver:
    """A stand-in for fleet's driver: trains the models an epoch at a time, honours the
    decisions, ends a model on its own stop rule (its `own_max` epochs), and can be requeued:
    its early stopping rebuilt from the records alone."""

    def __init__(self, es, curve, own_max):
        self.es, self.curve, self.own_max = es, curve, own_max
        self.done = {m: 0 for m in es.models}
        self.state = {m: "train" for m in es.models}
        self.history: list[tuple[str, int, float]] = []
        self.cap = es.settings.max_epochs

    def act(self, decisions) -> None:
        for d in decisions:
            self.state[d.model] = {C: "train", PR: "train", P: "paused", S: "stopped"}[d.verdict]

    def trainable(self) -> list[str]:
        return [m for m in self.es.models if self.state[m] == "train"]

    def step(self, model: str) -> None:
        epoch = self.done[model] = self.done[model] + 1
        metric = self.curve(model, epoch)
        self.history.append((model, epoch, metric))
        self.act(self.es.epoch_ended(model, epoch, metric))
        if epoch >= min(self.own_max[model], self.cap):
            self.state[model] = "ended"
            self.act(self.es.model_ended(model, epoch))

    def requeue(self, drop_last: int = 0) -> list[RungDecision]:
        """A new early stopping from the records (JSON and back); the last `drop_last` records
        lost (the job was cut while writing them). Returns what restore found due."""
        records = [RungDecision.from_record(json.loads(json.dumps(d.to_record()))) for d in self.es.decisions]
        kept = records[:len(records) - drop_last]
        fresh = create_early_stopping(self.es.settings, self.es.models)
        ended = {m: self.done[m] for m, s in self.state.items() if s == "ended"}
        due = fresh.restore(kept, ended=ended, history=self.history)
        self.es = fresh
        self.act(due)
        return due

    def run(self, picks, requeue_at: int | None = None, drop_last: int = 0) -> tuple[RungDecision, ...]:
        """Train until nothing can; the model to step is chosen by `picks` (cycled)."""
        steps = 0
        while trainable := self.trainable():
            if steps == requeue_at:
                self.requeue(drop_last)
            self.step(trainable[picks[steps % len(picks)] % len(trainable)])
            steps += 1
        return self.es.decisions


def curve(model: str, epoch: int) -> float:
    """A learning curve per model: models differ, and their order changes over epochs."""
    k = int(model[1:])
    return round(1.0 / (1 + epoch * (1 + k % 5)) + (k * 37 % 11) / 50, 6)


SCENARIOS = [
    ("asha", {"reduction": 2}),
    ("sha", {"reduction": 2}),
    ("sha", {"reduction": 3}),
    ("hyperband", {"reduction": 2}),
    ("median", {"min_models": 2, "grace_epochs": 2}),
]


@pytest.mark.parametrize("method, options", SCENARIOS, ids=[f"{m}-{i}" for i, (m, _) in enumerate(SCENARIOS)])
def test_a_requeue_anywhere_gives_the_same_decisions_as_a_run_that_never_stopped(method, options):
    models = [f"m{i}" for i in range(10)]
    own_max = {m: (3 if m in ("m2", "m7") else 9) for m in models}
    picks = [3, 1, 4, 1, 5, 9, 2, 6]

    def driver():
        return Driver(stopping(method, models, 9, **options), curve, own_max)

    straight = driver().run(picks)
    assert any(d.verdict is S for d in straight)
    for cut in range(0, 40, 3):
        assert driver().run(picks, requeue_at=cut) == straight, cut


@pytest.mark.parametrize("method", ["sha", "hyperband"])
def test_a_job_cut_between_a_rungs_decisions_gets_the_missing_ones_on_restore(method):
    models = [f"m{i}" for i in range(9)]
    first = Driver(stopping(method, models, 9), curve, {m: 9 for m in models})
    for m in models:
        first.step(m)  # every model reaches rung 1 (hyperband: bracket 0's models)
    full = first.es.decisions
    complete = next(i for i, d in enumerate(full) if d.verdict is not P)
    lost = len(full) - complete - 1  # all but the first of the rung's promotions and stops
    assert lost >= 2
    due = first.requeue(drop_last=lost)
    assert due == list(full[complete + 1:])
    assert first.es.decisions == full


def test_the_rung_methods_restore_from_the_records_alone():
    models = [f"m{i}" for i in range(6)]
    drv = Driver(stopping("sha", models, 9), curve, {m: 9 for m in models})
    for m in models:
        drv.step(m)
    fresh = create_early_stopping(drv.es.settings, models)
    assert fresh.restore(drv.es.decisions) == []
    assert fresh.paused() == drv.es.paused() and fresh.stopped() == drv.es.stopped()


# -- shares ---------------------------------------------------------------------------------------

def test_surviving_shares_from_the_rung_arithmetic():
    sha = surviving_share(EarlyStopSettings("sha", 81), 81)
    assert [(r.epochs, r.share) for r in sha] == [(1, 27 / 81), (3, 9 / 81), (9, 3 / 81), (27, 1 / 81)]
    hb = surviving_share(EarlyStopSettings("hyperband", 81), 143)
    # past rung 1: bracket 0's 27 of 81, the other brackets whole (34 + 15 + 8 + 5)
    assert hb[0].epochs == 1 and hb[0].share == pytest.approx((27 + 34 + 15 + 8 + 5) / 143)
    assert hb[-1].epochs == 27 and hb[-1].share == pytest.approx((1 + 1 + 1 + 2 + 5) / 143)
    asha = surviving_share(EarlyStopSettings("asha", 8, reduction=2), 4)
    # arrivals 1..4 at rung 1: continue with probability 1, 1/2, 1/3, 2/4
    assert asha[0].share == pytest.approx((1 + 1 / 2 + 1 / 3 + 2 / 4) / 4)
    med = surviving_share(EarlyStopSettings("median", 4, min_models=2), 10)
    assert [r.epochs for r in med] == [1, 2, 3] and med[0].share == pytest.approx((2 + 8 / 2) / 10)
    assert surviving_share(EarlyStopSettings("none", 8), 10) == ()


# -- properties over any arrival order ---------------------------------------------------------

events = st.lists(st.tuples(st.integers(0, 50), st.floats(0, 1), st.booleans()), min_size=1, max_size=120)


def drive_randomly(es, steps) -> None:
    """Step models chosen by `steps`, with their metrics; some end on their own."""
    state = {m: 0 for m in es.models}
    paused: set[str] = set()
    for pick, metric, ends in steps:
        active = [m for m in es.models if m in state and m not in paused]
        if not active:
            return
        model = active[pick % len(active)]
        state[model] += 1
        for d in es.epoch_ended(model, state[model], metric):
            if d.verdict is S:
                state.pop(d.model, None)
            if d.verdict is P:
                paused.add(d.model)
            else:
                paused.discard(d.model)
        if ends and pick % 7 == 0 and model in state and model not in paused:
            es.model_ended(model, state.pop(model))


@settings(max_examples=120, deadline=None)
@given(events, st.sampled_from([2, 3]))
def test_asha_never_stops_the_best_so_far_at_its_rung(steps, eta):
    es = stopping("asha", [f"m{i}" for i in range(7)], 9, reduction=eta)
    drive_randomly(es, steps)
    for d in es.decisions:
        before = [e.metric for e in es.decisions if e.rung == d.rung and e.seq < d.seq]
        if all(d.metric < v for v in before):
            assert d.verdict is C, d


@settings(max_examples=120, deadline=None)
@given(events, st.sampled_from(["sha", "hyperband"]), st.sampled_from([2, 3]))
def test_sha_promotes_exactly_the_top_share_of_every_decided_rung(steps, method, eta):
    es = stopping(method, [f"m{i}" for i in range(9)], 9, reduction=eta)
    drive_randomly(es, steps)
    for key in {(d.bracket, d.rung) for d in es.decisions if d.verdict in (PR, S)}:
        at = [d for d in es.decisions if (d.bracket, d.rung) == key]
        verdicts = [d for d in at if d.verdict in (PR, S)]
        promoted = [d for d in verdicts if d.verdict is PR]
        assert len(promoted) == max(1, math.floor(len(verdicts) / eta))
        assert {d.model for d in verdicts} <= {d.model for d in at if d.verdict is P}
        worst_promoted = max((d.metric if d.metric is not None else math.inf) for d in promoted)
        assert all((d.metric if d.metric is not None else math.inf) >= worst_promoted
                   for d in verdicts if d.verdict is S)


@settings(max_examples=120, deadline=None)
@given(events, st.sampled_from(["asha", "sha", "hyperband", "median"]))
def test_no_decision_is_repeated_for_a_model_and_rung(steps, method):
    options = {"min_models": 2} if method == "median" else {}
    es = stopping(method, [f"m{i}" for i in range(8)], 9, reduction=2, **options)
    drive_randomly(es, steps)
    seen = [(d.model, d.rung, d.verdict) for d in es.decisions]
    assert len(seen) == len(set(seen))
    finals = [(d.model, d.rung) for d in es.decisions if d.verdict is not P]
    assert len(finals) == len(set(finals))
    assert [d.seq for d in es.decisions] == list(range(len(es.decisions)))
    assert len([d for d in es.decisions if d.verdict is S]) == len(es.stopped())
