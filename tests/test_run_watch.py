"""`fleet run`'s watch over its mpiexec: one line per error, the rank that died, signals
forwarded, what can be written after a killed rank, and no segments left in /dev/shm."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import REPO, mpi_env
from fleet.runtime.events import read_events
from fleet.runtime.launch.supervise import Outcome, OutputFilter, mpi_segments, remove_leftover_segments

MPICH_KILLED = """
===================================================================================
=   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES
=   PID 123 RUNNING AT vm
=   EXIT CODE: 9
=   CLEANING UP REMAINING PROCESSES
=   YOU CAN IGNORE THE BELOW CLEANUP MESSAGES
===================================================================================
YOUR APPLICATION TERMINATED WITH THE EXIT STRING: Killed (signal 9)
This typically refers to a problem with your application.
Please see the FAQ page for debugging suggestions""".strip().splitlines()

OMPI_ABORT = """--------------------------------------------------------------------------
MPI_ABORT was invoked on rank 2 in communicator MPI_COMM_WORLD
  Proc: [[1,1],2]
  Errorcode: 3
--------------------------------------------------------------------------""".splitlines()


def shown(lines):
    outcome = Outcome()
    out_filter = OutputFilter(outcome)
    visible = [v for line in lines for v in out_filter.feed(line)] + out_filter.finish()
    return visible, outcome


def test_the_same_error_from_every_rank_is_shown_once_and_mpi_blocks_are_put_aside():
    lines = ["[  1.0s] == round 0 ==",
             "fleet: rank 1 (trainer, node 0): RuntimeError: boom in forward",
             "fleet: rank 2 (trainer, node 0): RuntimeError: boom in forward",
             "fleet: rank 3 (trainer, node 0): ValueError: something else",
             "Abort(3) on node 1 (rank 1 in comm 0): application called MPI_Abort(MPI_COMM_WORLD, 3) - process 1",
             *MPICH_KILLED, *OMPI_ABORT, "----", "a line of dashes is not a block"]
    visible, outcome = shown(lines)
    assert visible == ["[  1.0s] == round 0 ==", lines[1], lines[3], "----", "a line of dashes is not a block"]
    assert outcome.repeats == 1 and outcome.fleet_errors == [lines[1], lines[3]]
    assert outcome.exit_string == "Killed (signal 9)"
    assert "MPI_ABORT was invoked on rank 2 in communicator MPI_COMM_WORLD" in outcome.aside


def test_open_mpi_s_signal_line_says_how_the_job_ended():
    visible, outcome = shown(["prterun noticed that process rank 2 with PID 77 on node vm exited on signal 9 (Killed)."])
    assert visible == [] and outcome.exit_string == "signal 9 (Killed)"


def test_an_unrelated_dashed_block_is_shown_whole():
    block = ["-" * 30, "some warning from the launcher", "-" * 30]
    assert shown(block)[0] == block


def test_new_unused_segments_are_removed_and_others_kept(tmp_path):
    (tmp_path / "mpich_shm_old").write_bytes(b"x")
    before = mpi_segments(tmp_path)
    (tmp_path / "mpich_shm_new").write_bytes(b"x")
    (tmp_path / "unrelated").write_bytes(b"x")
    assert remove_leftover_segments(before, tmp_path) == ["mpich_shm_new"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mpich_shm_old", "unrelated"]


# ----------------------------------------------------------------- under a real mpiexec


def write_long_spec(tmp_path: Path) -> Path:
    doc = {"name": "watch", "seed": 1,
           "data": {"source": "digits", "image_size": 8, "channels": 1, "val_fraction": 0.2},
           "models": [{"family": "mlp", "name": n} for n in ("a", "b", "c")],
           "train": {"optimizer": "sgd", "lr": 0.05, "batch_size": 32, "max_epochs": 400, "stop": {"patience": 10000}},
           "scheduler": {"policy": "fleet-g", "profile": False},
           "cluster": {"nodes": 1, "gpus_per_node": 2, "preprocessors_per_node": 1, "device": "cpu"},
           "runtime": {"timeout_s": 60}}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def start_fleet_run(spec: Path, run_dir: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "fleet", "run", str(spec), "--run-dir", str(run_dir), "--quiet"],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=mpi_env())


def wait_for_training(run_dir: Path, job: subprocess.Popen) -> list[dict]:
    """The ranks, once a model trains and `fleet run`'s watch has had time to read ranks.json
    (it looks every 0.2 s until the file is there; these small models reach their first epoch
    within 0.1 s of it)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and job.poll() is None:
        events, ranks = run_dir / "events.jsonl", run_dir / "ranks.json"
        if events.exists() and '"event": "epoch"' in events.read_text() and time.time() - ranks.stat().st_mtime > 1.0:
            return json.loads(ranks.read_text())["ranks"]
        time.sleep(0.1)
    raise AssertionError(f"no epoch before the test could act (exit {job.poll()})")


@pytest.mark.mpi
def test_a_killed_rank_is_named_with_how_it_died_and_the_run_resumes(tmp_path):
    spec, run_dir = write_long_spec(tmp_path), tmp_path / "run"
    segments = mpi_segments()
    job = start_fleet_run(spec, run_dir)
    ranks = wait_for_training(run_dir, job)
    victim = next(r for r in ranks if r["role"] == "trainer")
    os.kill(victim["pid"], signal.SIGKILL)
    out, err = job.communicate(timeout=120)
    assert job.returncode not in (0, 75)
    lines = [line for line in err.splitlines() if "ended first" in line]
    assert len(lines) == 1 and f"rank {victim['rank']} (trainer, node 0, pid {victim['pid']})" in lines[0]
    assert "signal 9" in lines[0], err
    assert "BAD TERMINATION" not in out + err and "to resume" in err
    assert "ended first" in (run_dir / "fleet-errors.log").read_text()
    assert json.loads((run_dir / "results.json").read_text())["interrupted"] is True
    assert remove_leftover_segments(segments) == []  # fleet run removed what its job left (others' are in use)
    # the run resumes from its checkpoints (then the checkpoint signal stops it again)
    again = start_fleet_run(spec, run_dir)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and again.poll() is None:
        if any(e.get("event") == "member_start" and e.get("resume") for e in read_events(run_dir / "events.jsonl")):
            break
        time.sleep(0.1)
    again.send_signal(signal.SIGTERM)
    _, err = again.communicate(timeout=120)
    assert again.returncode == 75, err[-2000:]


@pytest.mark.mpi
def test_sigterm_to_fleet_run_checkpoints_the_job_instead_of_orphaning_it(tmp_path):
    spec, run_dir = write_long_spec(tmp_path), tmp_path / "run"
    job = start_fleet_run(spec, run_dir)
    ranks = wait_for_training(run_dir, job)
    job.send_signal(signal.SIGTERM)
    out, err = job.communicate(timeout=120)
    assert job.returncode == 75, err[-2000:]
    assert "checkpoint signal" in out
    alive = []
    for rank in ranks:
        try:
            os.kill(rank["pid"], 0)
            alive.append(rank["rank"])
        except ProcessLookupError:
            pass
    assert alive == [], f"ranks {alive} trained on after fleet run ended"
    assert json.loads((run_dir / "results.json").read_text())["interrupted"] is True


def test_a_job_whose_ranks_never_start_is_stopped_with_a_line(tmp_path):
    """A rank that fails before MPI is up leaves the others in MPI's start-up, where fleet's own
    deadlines do not reach: with no ranks.json after the start deadline, the watch stops the job."""
    import io

    from fleet.runtime.launch.supervise import JobWatch

    stuck = [sys.executable, "-c", "import time; print('rank 1: ImportError', flush=True); time.sleep(120)"]
    out = io.StringIO()
    began = time.monotonic()
    outcome = JobWatch(stuck, tmp_path, mpi_env(), out, io.StringIO(), start_timeout_s=1.0).run()
    assert time.monotonic() - began < 30 and outcome.returncode != 0
    assert "no rank had started after 1 s" in outcome.exit_string
    assert "rank 1: ImportError" in out.getvalue()
