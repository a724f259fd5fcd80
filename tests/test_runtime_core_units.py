"""The runtime's ground floor without processes: stream layouts, the event log's start-up
figures, waits that poll and time out, and the choice of busy or sleeping polls."""

import ctypes
import os
import sys
import threading

import pytest

from fleet.runtime import waiting
from fleet.runtime.events import first_batch_s
from fleet.runtime.protocol import StreamLayout
from fleet.runtime.waiting import Backoff, WaitTimeout, busy_polling_fits, poll, polling_threads, use_busy_polling


def test_layout_owner_pairs_preprocessors_with_masters():
    layout = StreamLayout(stream=1, version=0, preprocessors=(0, 9), masters=(3, 5, 7))
    assert [layout.owner(k) for k in range(4)] == [3, 5, 3, 5]
    one = StreamLayout(1, 1, (0, 9, 4), (8,))
    assert {one.owner(k) for k in range(6)} == {8}


def test_the_first_batch_is_the_earliest_member_start_plus_its_start_of_this_run():
    events = [
        {"time": 50.0, "event": "run_start"}, {"time": 51.0, "event": "member_start", "model": "old"},
        {"time": 60.0, "event": "epoch", "model": "old", "start_s": 0.5},  # an earlier run of the directory
        {"time": 100.0, "event": "run_start"},
        {"time": 100.5, "event": "member_start", "model": "a"}, {"time": 100.6, "event": "member_start", "model": "b"},
        {"time": 104.0, "event": "member_start", "model": "c"},
        {"time": 109.0, "event": "epoch", "model": "c", "start_s": 0.1},  # started last, trained first
        {"time": 110.0, "event": "epoch", "model": "a", "start_s": 3.7},
        {"time": 111.0, "event": "epoch", "model": "b", "start_s": 3.0},
        {"time": 112.0, "event": "epoch", "model": "b", "start_s": 0.0},
    ]
    assert first_batch_s(events) == pytest.approx(3.6)  # b: 100.6 + 3.0
    assert first_batch_s(events[:7]) is None  # no member has reported its first batch yet
    assert first_batch_s([]) is None


def test_poll_returns_the_first_truthy_value_and_times_out_with_the_reason():
    calls = iter([None, False, 0, 7])
    assert poll(lambda: next(calls), "x", timeout_s=1, backoff=Backoff(1e-5, 1e-4)) == 0
    with pytest.raises(WaitTimeout, match="waiting for the moon"):
        poll(lambda: None, "the moon", timeout_s=0.02, backoff=Backoff(1e-3, 1e-3))


def test_a_poll_that_waits_books_its_seconds_and_its_polling_cpu():
    books = waiting.WaitBooks()
    assert poll(lambda: 5, "x", timeout_s=1, books=books) == 5
    assert books.totals() == (0.0, 0.0)  # there at once: no wait
    calls = iter([None] * 20 + [3])
    assert poll(lambda: next(calls), "x", timeout_s=1, backoff=Backoff(1e-3, 2e-3), books=books) == 3
    seconds, cpu_s = books.totals()
    assert 0.02 <= seconds < 1.0 and 0.0 <= cpu_s < seconds  # it slept most of it
    assert books.since((0.01, 0.0)) == pytest.approx((seconds - 0.01, cpu_s))
    with pytest.raises(WaitTimeout):
        poll(lambda: None, "the moon", timeout_s=0.02, backoff=Backoff(1e-3, 1e-3), books=books)
    assert books.totals()[0] > seconds + 0.015  # a wait that timed out counts too


@pytest.mark.parametrize("affinity, node_threads, fits", [
    (16, 12, True),   # the node's polling threads fit the cores this job may use
    (16, 20, False),  # ranks outnumber cores
    (8, 10, False),   # a Slurm job's cgroup of 8 cores on a larger node: its 10 threads share them
    (2, 7, False),    # the 2-core VM with 3 trainers and a preprocessor
])
def test_busy_polling_fits_the_cores_this_job_may_use(monkeypatch, affinity, node_threads, fits):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(affinity)), raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    assert busy_polling_fits(node_threads) is fits


def test_a_trainer_that_decodes_its_own_data_polls_in_one_more_thread(monkeypatch):
    """Baseline's models decode in their trainer (a decoder thread beside its stream and
    training threads): 4 trainers and a preprocessor fit 12 cores with shared streams, not
    with their own decoders."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(12)), raising=False)
    assert polling_threads(4, 1, own_decoding=False) == 9 and busy_polling_fits(9)
    assert polling_threads(4, 1, own_decoding=True) == 13 and not busy_polling_fits(13)


def test_the_polling_choice_reaches_horovods_waits(monkeypatch):
    """tools/horovod-nospin.h reads FLEET_MPI_WAIT: busy keeps Horovod's blocking MPI calls."""
    monkeypatch.setattr(waiting, "HOT", waiting.HOT)
    monkeypatch.setenv("FLEET_MPI_WAIT", "")
    use_busy_polling(True)
    assert os.environ["FLEET_MPI_WAIT"] == "busy" and waiting.HOT is waiting.BUSY
    use_busy_polling(False)
    assert os.environ["FLEET_MPI_WAIT"] == "sleep" and waiting.HOT is waiting.SHARING


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="timer slack is Linux's")
def test_fine_sleeps_sets_the_calling_threads_timer_slack_only():
    """A 20 us sleep of a backoff overran by Linux's default 50 us timer slack."""
    libc = ctypes.CDLL(None)
    get_slack = lambda: libc.prctl(30, 0, 0, 0, 0)  # noqa: E731  PR_GET_TIMERSLACK, nanoseconds
    seen = []

    def worker() -> None:
        libc.prctl(29, 50_000, 0, 0, 0)  # PR_SET_TIMERSLACK: Linux's default
        waiting.fine_sleeps()
        seen.append(get_slack())

    before = get_slack()
    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert seen == [1000] and get_slack() == before
