"""`fleet status` with early stopping: rungs filling, models held at a rung and stopped there,
replayed from a synthetic events log; without early stopping the lines are as before."""

from __future__ import annotations

from fleet.report.status import render, replay
from test_report_early_stop import epoch, event, rung

SHA = {"method": "sha", "max_epochs": 9, "min_epochs": 1, "reduction": 3, "brackets": None, "grace_epochs": 1,
       "min_models": 5}  # rungs at epochs 1 and 3
LIMITS = {m: 9 for m in "abcd"}


HELD = [
    event("run_start", 0.0, policy="fleet-g", early_stop=SHA),
    event("round_start", 0.0, index=0),
    event("member_start", 0.0, model="a", gpus=[0]), event("member_start", 0.0, model="b", gpus=[1]),
    epoch(1.0, "a", 1, 0.6), epoch(1.2, "b", 1, 0.3),
    rung(1.0, "a", 1, 0, "paused", 0), rung(1.2, "b", 1, 0, "paused", 1),
    event("member_left", 1.3, model="a", converged=False), event("member_left", 1.3, model="b", converged=False),
    event("member_start", 1.4, model="c", gpus=[0]), event("member_start", 1.4, model="d", gpus=[1]),
    epoch(2.4, "c", 1, 0.2), rung(2.4, "c", 1, 0, "paused", 2),
    event("member_left", 2.5, model="c", converged=False),
]
DONE = HELD + [
    epoch(2.6, "d", 1, 0.1), rung(2.6, "d", 1, 0, "paused", 3),
    rung(2.6, "a", 1, 0, "promoted", 4),
    *(rung(2.6, m, 1, 0, "stopped", 5 + k) for k, m in enumerate("bcd")),
    *(event("converged", 2.6, model=m, reason="early_stop", rung=0, epochs=1) for m in "bcd"),
    event("member_left", 2.7, model="d", converged=True),
    event("member_start", 3.0, model="a", gpus=[0, 1]),
    epoch(4.0, "a", 2, 0.7), epoch(5.0, "a", 3, 0.8),
    rung(5.0, "a", 3, 1, "paused", 8), rung(5.0, "a", 3, 1, "promoted", 9),
    epoch(6.0, "a", 4, 0.8),
]


def lines_of(events) -> list[str]:
    return render(replay(events, LIMITS), "runs/es: running")


def rows(lines: list[str], first: str) -> dict[str, list[str]]:
    return {line.split()[0]: line.split() for line in lines if line.split() and line.split()[0] in first}


def test_rungs_fill_and_paused_models_are_held_at_their_rung():
    lines = lines_of(HELD)
    assert lines[1] == ("3/36 epochs (at most: stop rules end models early), 0/4 models converged "
                        "(0 stopped by early stopping), 3 held at a rung, round 0")
    assert lines[2].startswith("early stopping (sha): rungs filling")
    assert lines[3].split() == ["rung", "at", "epoch", "reported", "decided", "continue", "stopped", "paused", "promoted"]
    assert [line.split() for line in lines[5:7]] == [["1", "3", "3", "0", "0", "3", "0"],
                                                    ["3", "0", "0", "0", "0", "0", "0"]]
    states = {line.split()[0]: " ".join(line.split()[1:4]) for line in lines[7:] if line.split()[0] in "abcd"}
    assert states == {"a": "held at rung", "b": "held at rung", "c": "held at rung", "d": "training 1 0/9"}
    assert all("held at rung 1 " in line for line in lines if line.split()[0] in "abc")
    assert [line.split()[0] for line in lines[-4:]] == ["d", "a", "b", "c"]  # training, then held


def test_a_resumed_job_keeps_its_held_models_held():
    job = replay([*HELD, event("run_start", 100.0, policy="fleet-g", early_stop=SHA)], LIMITS)
    assert {m: s.state for m, s in job.models.items()} == {"a": "held", "b": "held", "c": "held", "d": "waiting"}
    assert job.models["a"].rung == 0


def test_stopped_models_show_their_rung_and_the_promoted_one_trains_on():
    lines = lines_of(DONE)
    assert "3/4 models converged (3 stopped by early stopping), 0 held at a rung" in lines[1]
    assert [line.split() for line in lines[5:7]] == [["1", "4", "4", "0", "3", "0", "1"],
                                                    ["3", "1", "1", "0", "0", "0", "1"]]
    models = {line.split()[0]: line for line in lines[7:] if line.split()[0] in "abcd"}
    assert models["a"].split()[1:4] == ["training", "0-1", "4/9"]
    for m in "bcd":
        assert models[m].split()[1:6] == ["stopped", "at", "rung", "1", "-"], models[m]
    job = replay(DONE, LIMITS)
    assert (job.epochs_done, job.epochs_at_most) == (7, 12)  # a may train to 9; b, c, d ended at 1


def test_median_rungs_come_from_the_records_alone():
    median = {"method": "median", "max_epochs": 9, "min_epochs": 1, "reduction": 3, "grace_epochs": 2, "min_models": 1}
    log = [event("run_start", 0.0, early_stop=median), epoch(1.0, "a", 1, 0.5), epoch(1.0, "b", 1, 0.4),
           epoch(2.0, "a", 2, 0.6), epoch(2.0, "b", 2, 0.4), rung(2.0, "a", 2, 0, "continue", 0),
           rung(2.0, "b", 2, 0, "stopped", 1), event("converged", 2.0, model="b", reason="early_stop", rung=0)]
    lines = lines_of(log)
    assert lines[5].split() == ["2", "2", "2", "1", "1", "0", "0"]  # one rung: the epoch decided
    assert lines[6].startswith("model") and "stopped at rung 1" in "".join(lines)


def test_without_early_stopping_the_lines_are_as_before():
    log = [event("run_start", 0.0, policy="fleet-g"), event("run_start", 0.5, early_stop={"method": "none"}),
           event("member_start", 1.0, model="a", gpus=[0]), epoch(2.0, "a", 1, 0.5),
           event("converged", 2.0, model="b", reason="patience")]
    assert lines_of(log) == [
        "runs/es: running",
        "1/27 epochs (at most: stop rules end models early), 1/4 models converged",
        "model  state                 GPU  epoch  best val acc  last loss",
        "-----  --------------------  ---  -----  ------------  ---------",
        "a      training              0    1/9    0.500         1.0000",
        "c      waiting               -    0/9    -             -",
        "d      waiting               -    0/9    -             -",
        "b      converged (patience)  -    0/9    -             -",
    ]
