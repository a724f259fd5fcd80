"""`fleet status RUN_DIR`: a model's state from the events log, on a running and a finished job."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from conftest import REPO, mpi_env
from fleet.report.status import replay, time_left
from test_runtime_mpi import kill_job, start_train, three_cnns_on_two_slots, wait_for_epochs, write_spec


def event(kind: str, time: float, **fields) -> dict:
    return {"event": kind, "time": time, **fields}


def test_replay_follows_each_model_through_a_killed_job_and_its_resume():
    log = [
        event("run_start", 0.0, policy="fleet-g"),
        event("round_start", 0.0, index=0),
        event("member_start", 0.1, model="a", gpus=[0, 1]),
        event("member_start", 0.1, model="b", gpus=[2]),
        event("epoch", 5.0, model="a", epoch=1, train_loss=1.5, val_accuracy=0.4),
        event("epoch", 6.0, model="b", epoch=1, train_loss=1.2, val_accuracy=0.5),
        event("epoch", 9.0, model="b", epoch=2, train_loss=1.0, val_accuracy=0.45),
        event("converged", 9.0, model="b", epochs=2, reason="max_epochs"),
        event("member_left", 9.1, model="b", converged=True),
        # killed here: a trains on no more; the next job resumes it
    ]
    killed = replay(log, {"a": 3, "b": 2, "c": 3})
    assert (killed.models["a"].state, killed.models["a"].gpus) == ("training", (0, 1))
    assert (killed.models["b"].state, killed.models["b"].best_accuracy) == ("converged", 0.5)
    assert killed.models["c"].state == "waiting"
    assert (killed.epochs_done, killed.epochs_at_most) == (3, 8)
    assert time_left(killed, now=10.0) == pytest.approx(5 / 0.3)  # 3 epochs in 10 s, 5 to go at most
    resumed = replay([*log, event("run_start", 100.0, policy="fleet-g")], {"a": 3, "b": 2, "c": 3})
    assert resumed.models["a"].state == "waiting" and resumed.jobs == 2
    assert time_left(resumed, now=101.0) is None  # no epoch in this job yet


def status_while_training(command: list[str], job: subprocess.Popen, tries: int = 20) -> subprocess.CompletedProcess:
    """`fleet status` on a running job, asked again (up to `tries` times) until a model is
    training: at a round's end every model may be checkpointing or waiting for a moment."""
    for _ in range(tries):
        done = subprocess.run(command, capture_output=True, text=True, cwd=REPO, env=mpi_env(), timeout=60)
        if done.returncode != 0 or " training " in done.stdout or job.poll() is not None:
            break
        time.sleep(0.2)
    return done


@pytest.mark.mpi
@pytest.mark.slow
def test_fleet_status_on_a_running_and_on_a_finished_job(tmp_path):
    models, data, cluster = three_cnns_on_two_slots()
    # epochs enough that the job still trains while `fleet status` starts and reads it
    train_cfg = {"batch_size": 32, "max_epochs": 16, "optimizer": "sgd", "lr": 0.05, "stop": {"patience": 100}}
    spec = write_spec(tmp_path / "s.yaml", models, cluster, "fleet-g", data=data, train=train_cfg)
    run_dir = tmp_path / "run"
    status = [sys.executable, "-m", "fleet", "status", str(run_dir)]
    job = start_train(3, spec, run_dir)
    try:
        wait_for_epochs(job, run_dir, 1, "fleet status")
        done = status_while_training(status, job)
    finally:
        job.wait(timeout=300)
        if job.returncode is None:
            kill_job(job)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith(f"{run_dir}: running: fleet train (host ") and "left at this job's pace" in lines[0]
    training = [line for line in lines if " training " in line]
    assert training and all("/16" in line for line in training), lines
    assert any(line.split()[2] in ("0", "1", "0-1") for line in training), lines  # the cpu slot column
    after = subprocess.run(status, capture_output=True, text=True, cwd=REPO, env=mpi_env(), timeout=60)
    assert after.stdout.startswith(f"{run_dir}: finished after ") and "3/3 models converged" in after.stdout
