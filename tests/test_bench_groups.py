"""bench/groups.py --runtime's pure parts: the rounds' rotated order, what a run's events say
about decoding each group once per epoch pass, and the medians over rounds."""

from __future__ import annotations

import importlib
import statistics
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
GROUPS = {"wide-a": "a", "small-a": "a", "wide-b": "b", "small-b": "b"}


@pytest.fixture(scope="module")
def groups():
    """bench/groups.py, imported as a bench script is run: with bench/ first on sys.path."""
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(BENCH))
        yield importlib.import_module("groups")


def test_every_round_starts_with_another_run(groups):
    order = ("grouped", "model-task", "job-array")
    firsts = [groups.rotated(order, index)[0] for index in range(3)]
    assert firsts == ["grouped", "model-task", "job-array"]
    assert all(sorted(groups.rotated(order, index)) == sorted(order) for index in range(5))
    assert groups.RUN_ORDER[-1] == groups.JOB_ARRAY and set(groups.GROUP_POLICIES) < set(groups.RUN_ORDER)


def member(model: str, stream: int) -> dict:
    return {"event": "member_start", "model": model, "stream": stream}


def stream_end(stream: int, decoded: int) -> dict:
    return {"event": "stream_end", "stream": stream, "decoded": decoded}


def test_a_group_shared_by_its_configurations_is_decoded_once_per_pass(groups):
    # group a: both configurations on stream 0, 3 passes of 100; group b: its second
    # configuration joined stream 1 after the first's 3 passes were decoded (6 passes of 50)
    events = [member("wide-a", 0), member("small-a", 0), member("wide-b", 1), member("small-b", 1),
              stream_end(0, 300), stream_end(1, 300)]
    decoded = groups.decoded_by_group(events, GROUPS)
    assert decoded == {"a": 300, "b": 300}
    assert groups.decoded_once(decoded, {"a": 100, "b": 50}, {"a": 3, "b": 3}) == 1


def test_a_group_on_two_streams_counts_both(groups):
    events = [member("wide-a", 0), member("small-a", 1), stream_end(0, 300), stream_end(1, 300)]
    decoded = groups.decoded_by_group(events, GROUPS)
    assert decoded == {"a": 600}
    assert groups.decoded_once(decoded, {"a": 100}, {"a": 3}) == 0
    assert groups.decoded_once({"a": 340}, {"a": 100}, {"a": 3}) == 1  # within half a pass: a chunk's rest
    assert groups.decoded_once({}, {"a": 100}, {"a": 3}) == 0  # nothing decoded: not "once"


def test_group_facts_and_best_per_group(groups):
    results = {"groups": GROUPS, "models": [
        {"id": "wide-a", "epochs": 3, "history": [{"samples": 100}], "best_val_accuracy": 0.5},
        {"id": "small-a", "epochs": 2, "history": [{"samples": 100}], "best_val_accuracy": 0.75},
        {"id": "wide-b", "epochs": 1, "history": [{"samples": 40}], "best_val_accuracy": 0.25},
        {"id": "small-b", "epochs": 0, "history": [], "best_val_accuracy": None}]}
    assert groups.group_facts(results) == ({"a": 100, "b": 40}, {"a": 3, "b": 1})
    best = {m["id"]: m["best_val_accuracy"] or 0.0 for m in results["models"]}
    assert groups.best_per_group(best, GROUPS) == pytest.approx((0.75 + 0.25) / 2)


def test_medians_over_rounds(groups):
    runs = [groups.Measured(10.0, 20.0, 3.0, 900, 24, 0.6), groups.Measured(30.0, 22.0, 5.0, 900, 24, 0.6),
            groups.Measured(20.0, 21.0, 4.0, 900, 22, 0.7)]
    assert groups.medians(runs) == {"wall_s": 20.0, "cpu_s": 21.0, "makespan_s": 4.0, "decoded": 900,
                                    "decoded_once": 24, "accuracy": 0.6}
    array = [groups.Measured(50.0, 90.0, None, 1800, 0, 0.6)]
    assert groups.medians(array)["makespan_s"] is None


def test_the_job_array_counts_training_samples_like_fleet(groups):
    # each task decodes its group's training samples every epoch; its samples_decoded also
    # holds the validation set it decoded once, which fleet's samples_decoded does not count
    trained = [{"id": "wide-a", "epochs": 3, "samples_decoded": 3 * 100 + 25},
               {"id": "small-a", "epochs": 2, "samples_decoded": 2 * 100 + 25},
               {"id": "wide-b", "epochs": 3, "samples_decoded": 3 * 40 + 10}]
    decoded = groups.tasks_decoded(trained, GROUPS, {"a": 100, "b": 40})
    assert decoded == {"a": 500, "b": 120}
    assert groups.decoded_once(decoded, {"a": 100, "b": 40}, {"a": 3, "b": 3}) == 1


def test_best_accuracy_is_compared_group_by_group_within_each_round(groups):
    runs = [groups.Measured(1, 1, 1, 1, 1, 0.5, {"a": 0.6, "b": 0.4}),
            groups.Measured(1, 1, 1, 1, 1, 0.5, {"a": 0.7, "b": 0.5})]
    peers = [groups.Measured(1, 1, 1, 1, 1, 0.5, {"a": 0.5, "b": 0.4, "c": 0.9}),
             groups.Measured(1, 1, 1, 1, 1, 0.5, {"a": 0.6, "b": 0.3})]
    mean, error, pairs = groups.paired_difference(runs, peers)
    diffs = [0.1, 0.0, 0.1, 0.2]  # a group only one side trained ("c") is left out
    assert pairs == 4 and mean == pytest.approx(0.1)
    assert error == pytest.approx(statistics.stdev(diffs) / 2)
    assert groups.paired_difference(runs[:1], [groups.Measured(1, 1, 1, 1, 1, 0.5, {"a": 0.5})]) is None
    assert groups.best_by_group({"wide-a": 0.5, "small-a": 0.75, "wide-b": 0.25}, GROUPS) == {"a": 0.75, "b": 0.25}
