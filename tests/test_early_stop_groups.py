"""Early stopping over groups (issue 47), pure: with cohorts (each model's group), every rung
compares the configurations of one group with each other, never across groups; each group is
decided exactly as a run of its own would be, with one sequence of decisions for the run, and a
requeued run restores the same; the simulator's rungs go by group too."""

from __future__ import annotations

import json

import pytest

from fleet.schedule import create_policy, paper100, simulate
from fleet.schedule.early_stop import EarlyStopSettings, RungDecision, Verdict, create_early_stopping
from fleet.schedule.group_workload import grouped_scenario
from fleet.schedule.grouping import group_of
from fleet.schedule.planners import GROUP_POLICIES

C, S, P, PR = Verdict.CONTINUE, Verdict.STOPPED, Verdict.PAUSED, Verdict.PROMOTED
GROUPS = {"a-x": "x", "b-x": "x", "c-x": "x", "d-x": "x", "a-y": "y", "b-y": "y", "c-y": "y", "d-y": "y"}
MODELS = list(GROUPS)


def brief(decisions) -> list[tuple]:
    return [(d.model, d.rung, d.verdict, d.cutoff) for d in decisions]


def test_asha_decides_a_rung_among_the_models_of_one_group():
    """η = 2: a-x (.1) and b-x (.2) arrive in group x; then a-y (.9), far worse than both, is
    the first of group y and trains on (fewer than η there), where across groups it would be
    the worst of three and stop."""
    settings = EarlyStopSettings("asha", 8, reduction=2)
    grouped = create_early_stopping(settings, MODELS, GROUPS)
    made = [grouped.epoch_ended(m, 1, v) for m, v in (("a-x", 0.1), ("b-x", 0.2), ("a-y", 0.9), ("b-y", 0.95))]
    assert [brief(d) for d in made] == [[("a-x", 1, C, None)], [("b-x", 1, S, 0.1)], [("a-y", 1, C, None)],
                                        [("b-y", 1, S, 0.9)]]
    assert [d.seq for d in grouped.decisions] == [0, 1, 2, 3]  # one sequence for the run
    across = create_early_stopping(settings, MODELS)
    for m, v in (("a-x", 0.1), ("b-x", 0.2)):
        across.epoch_ended(m, 1, v)
    assert brief(across.epoch_ended("a-y", 1, 0.9)) == [("a-y", 1, S, 0.1)]


def test_sha_promotes_a_group_once_its_own_models_reported_without_waiting_for_the_others():
    grouped = create_early_stopping(EarlyStopSettings("sha", 8, reduction=2), MODELS, GROUPS)
    for m, v in (("a-x", 0.4), ("b-x", 0.1), ("c-x", 0.3), ("a-y", 0.5)):
        assert brief(grouped.epoch_ended(m, 1, v)) == [(m, 1, P, None)]
    made = grouped.epoch_ended("d-x", 1, 0.2)  # group x is full; group y has one of four
    assert brief(made) == [("d-x", 1, P, None), ("a-x", 1, S, 0.2), ("b-x", 1, PR, 0.2), ("c-x", 1, S, 0.2),
                           ("d-x", 1, PR, 0.2)]
    assert grouped.paused() == ["a-y"] and grouped.stopped() == ["a-x", "c-x"]


def test_median_compares_with_the_others_of_the_group_only():
    settings = EarlyStopSettings("median", 8, min_models=1, grace_epochs=1)
    grouped = create_early_stopping(settings, MODELS, GROUPS)
    assert grouped.epoch_ended("a-x", 1, 0.1) == [] and grouped.epoch_ended("a-y", 1, 0.9) == []  # alone there
    assert brief(grouped.epoch_ended("b-y", 1, 0.95)) == [("b-y", 1, S, 0.9)]
    across = create_early_stopping(settings, MODELS)
    across.epoch_ended("a-x", 1, 0.1)
    assert brief(across.epoch_ended("a-y", 1, 0.9)) == [("a-y", 1, S, 0.1)]


def curve(model: str, epoch: int) -> float:
    """A learning curve per model; its configuration and group both move it."""
    k = "abcd".index(model[0]) + (7 if model.endswith("y") else 0)
    return round(1.0 / (1 + epoch * (1 + k % 5)) + (k * 37 % 11) / 50, 6)


ORDER = [(m, e) for e in range(1, 9) for m in ("a-x", "a-y", "b-y", "c-x", "b-x", "d-y", "c-y", "d-x")]


def replay(early, order=ORDER) -> list[RungDecision]:
    """Every model steps through `order` while early stopping lets it (stopped and paused models
    wait; a paused model steps on once promoted)."""
    reached: dict[str, int] = {}
    for model, epoch in order:
        if early.is_stopped(model) or model in early.paused() or reached.get(model, 0) != epoch - 1:
            continue
        reached[model] = epoch
        early.epoch_ended(model, epoch, curve(model, epoch))
    return list(early.decisions)


@pytest.mark.parametrize("method, options", [("asha", {"reduction": 2}), ("sha", {"reduction": 2}),
                                             ("hyperband", {"reduction": 2, "brackets": 2}), ("median", {"min_models": 1})])
def test_each_group_is_decided_as_a_run_of_its_own_and_a_requeue_restores_it(method, options):
    settings = EarlyStopSettings(method, 8, **options)
    grouped = replay(create_early_stopping(settings, MODELS, GROUPS))
    assert any(d.verdict is S for d in grouped) and [d.seq for d in grouped] == list(range(len(grouped)))
    for group in ("x", "y"):
        mine = [m for m in MODELS if GROUPS[m] == group]
        alone = replay(create_early_stopping(settings, mine), [(m, e) for m, e in ORDER if m in mine])
        assert brief(d for d in grouped if GROUPS[d.model] == group) == brief(alone), group
    records = [RungDecision.from_record(json.loads(json.dumps(d.to_record()))) for d in grouped]
    fresh = create_early_stopping(settings, MODELS, GROUPS)
    cut = len(records) // 2
    due = fresh.restore(records[:cut])  # a rung cut mid-batch: its missing decisions are due at once
    assert list(fresh.decisions) == grouped[:cut + len(due)]
    assert replay(fresh) == grouped  # the requeued run goes on to the same decisions


@pytest.mark.parametrize("policy", GROUP_POLICIES)
def test_the_simulator_decides_each_groups_rungs_within_the_group(policy):
    """sha pauses every model at a rung: each group policy resumes the promoted ones (one
    promoted while its hold was being saved is back PAUSED once, never launched twice)."""
    scenario = grouped_scenario(paper100(0), 2, 1.0, 4, configurations=4)
    longest = max(scenario.true_epochs)
    result = simulate(create_policy(policy), scenario, early_stop=EarlyStopSettings("sha", longest, reduction=2))
    first = min(d.rung for d in result.rung_decisions)
    by_group: dict[str, list[RungDecision]] = {}
    for d in result.rung_decisions:
        if d.rung == first and d.verdict in (PR, S):
            by_group.setdefault(group_of(scenario.rates, d.model), []).append(d)
    assert len(by_group) == 2
    for group, decided in by_group.items():
        assert [d.verdict for d in decided].count(PR) == 2, group  # max(1, floor(4 / 2)) of its own four
        second_best = sorted(d.metric for d in decided)[1]
        assert {d.cutoff for d in decided} == {second_best}, group  # ranked among its own four only
