"""One job per run directory: the lock, its holder line, stale locks and requeued jobs."""

import json
import os
import subprocess
import sys
import time

import pytest
from pathlib import Path

from fleet.errors import UserError
from fleet.runlock import LOCK_NAME, RunDirInUse, RunLock


def dead_pid() -> int:
    """The pid of a process that has exited (and was reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def plant(run_dir, **fields) -> None:
    record = {"host": "elsewhere", "pid": 4242, "proc_start": "", "since": time.time(), "job": None,
              "command": "fleet train", "token": "theirs", **fields}
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / LOCK_NAME).write_text(json.dumps(record))


def test_a_second_holder_is_stopped_with_one_line_naming_the_first(tmp_path):
    first = RunLock(tmp_path / "run", "fleet train")
    first.acquire()
    try:
        with pytest.raises(RunDirInUse) as caught:
            RunLock(tmp_path / "run", "fleet profile").acquire()
        message = str(caught.value)
        assert "\n" not in message and "fleet train" in message and f"pid {os.getpid()}" in message
        assert "host " in message and "since " in message
        with pytest.raises(RunDirInUse):
            RunLock(tmp_path / "run", "fleet run").check_free()
    finally:
        first.release()
    assert not (tmp_path / "run" / LOCK_NAME).exists()
    RunLock(tmp_path / "run", "fleet run").check_free()  # free again


def test_a_lock_left_by_a_dead_process_on_this_host_is_taken_over(tmp_path):
    lock = RunLock(tmp_path, "fleet train")
    plant(tmp_path, host=lock.host, pid=dead_pid())
    lock.acquire()
    try:
        assert lock.note and "no longer runs" in lock.note
        assert json.loads((tmp_path / LOCK_NAME).read_text())["token"] == lock.token
    finally:
        lock.release()


def test_a_live_holder_on_this_host_is_not_taken_for_stale_even_with_an_old_heartbeat(tmp_path):
    lock = RunLock(tmp_path, "fleet train", stale_after_s=0.1)
    plant(tmp_path, host=lock.host, pid=os.getppid())
    old = time.time() - 3600
    os.utime(tmp_path / LOCK_NAME, (old, old))
    with pytest.raises(RunDirInUse, match=f"pid {os.getppid()}"):
        lock.acquire()


def test_a_holder_on_another_host_is_stale_once_its_heartbeat_stops(tmp_path):
    plant(tmp_path)
    with pytest.raises(RunDirInUse, match="host elsewhere, pid 4242"):
        RunLock(tmp_path, "fleet train", stale_after_s=30).acquire()
    old = time.time() - 60
    os.utime(tmp_path / LOCK_NAME, (old, old))
    lock = RunLock(tmp_path, "fleet train", stale_after_s=30)
    lock.acquire()
    lock.release()


def test_a_requeued_job_waits_for_its_first_copy_on_another_host_to_stop(tmp_path):
    """Slurm requeued the job: the same job id holds the lock from another node. The new copy
    waits for that heartbeat to stop (the old copy shutting down), then takes over."""
    plant(tmp_path, job="77")
    lock = RunLock(tmp_path, "fleet train", job="77", stale_after_s=1.5)
    began = time.monotonic()
    lock.acquire(poll_s=0.1)
    waited = time.monotonic() - began
    lock.release()
    assert 1.0 < waited < 30 and lock.note
    plant(tmp_path, job="78")  # another job: no waiting
    with pytest.raises(RunDirInUse):
        RunLock(tmp_path, "fleet train", job="77", stale_after_s=1.5).acquire(poll_s=0.1)


def test_a_run_directory_that_is_a_file_is_named(tmp_path):
    path = tmp_path / "run"
    path.write_text("not a directory")
    for call in (lambda lock: lock.check_free(), lambda lock: lock.acquire()):
        with pytest.raises(UserError, match="is a file, not a directory"):
            call(RunLock(path, "fleet run"))


def test_losing_the_lock_is_reported(tmp_path, monkeypatch):
    import fleet.runlock as runlock

    monkeypatch.setattr(runlock, "HEARTBEAT_S", 0.05)
    lost = []
    lock = RunLock(tmp_path, "fleet train")
    lock.acquire(on_lost=lost.append)
    plant(tmp_path, host="thief", pid=1)
    deadline = time.monotonic() + 10
    while not lost and time.monotonic() < deadline:
        time.sleep(0.05)
    lock.release()
    assert lost and "lost the run directory lock to fleet train (host thief, pid 1" in lost[0]
    assert (tmp_path / LOCK_NAME).exists()  # the thief's lock is not removed by the loser


def test_a_killed_holder_not_yet_reaped_is_not_alive(tmp_path):
    """A job killed by SIGKILL leaves zombies until their parent reaps them; `kill(pid, 0)`
    still succeeds on one, but it holds nothing."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        lock = RunLock(tmp_path, "fleet train")
        plant(tmp_path, host=lock.host, pid=child.pid)
        child.kill()
        deadline = time.monotonic() + 10
        while Path(f"/proc/{child.pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z":
            assert time.monotonic() < deadline
            time.sleep(0.01)
        lock.acquire()  # the zombie's lock is taken over
        assert lock.note
        lock.release()
    finally:
        child.kill()
        child.wait()
