"""`fleet submit --scheduler slurm` on a real Slurm: the local one-node cluster of
slurm/local-cluster.sh (munge, slurmctld, slurmd; `.ci/run` starts it around `make test`).

Skipped, with the reason, when sbatch is missing or the cluster is not up; with
FLEET_REQUIRE_SLURM=1 (CI) they fail instead. SLURM_CONF defaults to the local cluster's
($FLEET_SLURM_DIR/slurm.conf, /tmp/fleet-slurm by default) when that file exists.

The checkpoint tests need the runtime's checkpoint signal (USR1 or TERM -> every rank exits 75).
"""

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.slurm

JOB_TIMEOUT_S = 240
DONE_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL",
               "DEADLINE"}


def _not_ready(reason: str) -> None:
    if os.environ.get("FLEET_REQUIRE_SLURM") == "1":
        pytest.fail(f"FLEET_REQUIRE_SLURM=1 but {reason}")
    pytest.skip(reason)


def _running(pid_file: Path) -> bool:
    try:
        os.kill(int(pid_file.read_text()), 0)
    except (OSError, ValueError):
        return False
    return True


@pytest.fixture(scope="module")
def slurm_env() -> dict:
    """The environment for Slurm commands; skips when there is no running cluster."""
    if shutil.which("sbatch") is None:
        _not_ready("sbatch not found: no Slurm here (slurm/local-cluster.sh start installs and starts one)")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    local = Path(os.environ.get("FLEET_SLURM_DIR", "/tmp/fleet-slurm"))
    if "SLURM_CONF" not in env and (local / "slurm.conf").exists():
        env["SLURM_CONF"] = str(local / "slurm.conf")
    if env.get("SLURM_CONF") == str(local / "slurm.conf") and not _running(local / "run" / "slurmctld.pid"):
        _not_ready(f"the local Slurm cluster is not running (no slurmctld of {local}); "
                   f"start it with slurm/local-cluster.sh start")
    try:
        done = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, env=env, timeout=20)
    except subprocess.TimeoutExpired:
        done = subprocess.CompletedProcess([], 1, "", "sinfo timed out")
    states = done.stdout.split()
    if done.returncode != 0 or not any(s.rstrip("*~#$@+") in ("idle", "mixed", "allocated") for s in states):
        why = done.stderr.strip().splitlines()[0] if done.stderr.strip() else f"node states {states}"
        _not_ready(f"the Slurm cluster is not up ({why}); start it with slurm/local-cluster.sh start")
    return env


@pytest.fixture
def jobs(slurm_env):
    """Job ids a test submitted; cancelled at the end if still there."""
    submitted: list[str] = []
    yield submitted
    for job_id in submitted:
        subprocess.run(["scancel", job_id], env=slurm_env, capture_output=True)


def run(env: dict, *command: str, timeout: float = 60) -> str:
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{shlex.join(command)}: {done.stderr.strip()}"
    return done.stdout


def job_fields(env: dict, job_id: str) -> dict[str, str]:
    """``scontrol show job -o``'s fields (no slurmdbd needed)."""
    line = run(env, "scontrol", "show", "job", "-o", job_id)
    return dict(item.split("=", 1) for item in line.split() if "=" in item)


def wait_job(env: dict, job_id: str, until, what: str, timeout: float = JOB_TIMEOUT_S) -> dict[str, str]:
    deadline = time.monotonic() + timeout
    while True:
        fields = job_fields(env, job_id)
        if until(fields):
            return fields
        assert time.monotonic() < deadline, f"job {job_id}: no {what} after {timeout} s: {fields}"
        time.sleep(0.5)


def finished(fields: dict) -> bool:
    return fields["JobState"] in DONE_STATES


def write_spec(path: Path, epochs: int, models: int) -> Path:
    doc = {
        "name": "slurmy", "seed": 1, "data": {"source": "digits", "val_fraction": 0.2},
        "models": [{"family": "mlp", "name": f"m{i}", "params": {"hidden": [16 * (i + 1)]}} for i in range(models)],
        "train": {"batch_size": 16, "max_epochs": epochs, "optimizer": "adam", "lr": 0.01, "stop": {"patience": 100}},
        "scheduler": {"profile": False},  # rates from FLOPs: no profiling pass before training
        "cluster": {"nodes": 1, "gpus_per_node": 2, "preprocessors_per_node": 1, "device": "cpu"},
        "runtime": {"timeout_s": 120},
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def submit(env: dict, spec: Path, run_dir: Path, jobs: list) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "fleet", "submit", str(spec), "--scheduler", "slurm", "--run-dir", str(run_dir),
         "--time", "10"],
        env=env, capture_output=True, text=True, timeout=60, cwd=spec.parent,
    )
    assert done.returncode == 0, done.stderr
    assert f"wrote {run_dir / 'sbatch.sh'}" in done.stdout
    job_id = done.stdout.split("submitted slurm job ")[1].split(";")[0].split()[0]
    jobs.append(job_id)
    return job_id


def epochs_logged(run_dir: Path) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for line in (run_dir / "events.jsonl").read_text().splitlines():
        event = json.loads(line)
        if event["event"] == "epoch":
            out.setdefault(event["model"], []).append(event["epoch"])
    return out


def any_epoch_logged(run_dir: Path) -> bool:
    """Whether events.jsonl has an epoch event yet (it may be mid-write)."""
    try:
        return bool(epochs_logged(run_dir))
    except (OSError, ValueError):
        return False


def checkpointed_epochs(run_dir: Path) -> dict[str, int]:
    return {
        p.parent.name: json.loads(p.read_text())["epochs"] for p in (run_dir / "checkpoints").glob("*/latest.json")
    }


def job_log(run_dir: Path, job_id: str) -> str:
    path = run_dir / f"slurm-{job_id}.out"
    return path.read_text() if path.exists() else "(no job output)"


def signal_after_the_first_epoch(env: dict, jobs: list, tmp_path: Path, epochs: int, scancel_args: list[str]):
    """Submit 3 models for `epochs` epochs, wait for the first epoch event, then signal the
    job with ``scancel SCANCEL_ARGS``; returns the run directory and the job id."""
    spec = write_spec(tmp_path / "spec.yaml", epochs=epochs, models=3)
    run_dir = tmp_path / "run"
    job_id = submit(env, spec, run_dir, jobs)
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while not any_epoch_logged(run_dir):
        assert time.monotonic() < deadline and not finished(job_fields(env, job_id)), job_log(run_dir, job_id)[-4000:]
        time.sleep(0.2)
    run(env, "scancel", *scancel_args, job_id)
    return run_dir, job_id


# ------------------------------------------------------------------------------------------


def test_srun_pmi2_starts_mpi4py_ranks_of_the_mpich_wheel(slurm_env):
    """srun --mpi=pmi2 wires up MPICH's ranks (PMI-1 over Slurm's pmi2 plugin): distinct ranks,
    a correct allreduce, and the job-environment adapter sees an srun step."""
    probe = (
        "import os; from mpi4py import MPI; from fleet.runtime.launch.jobenv import read_job_env; "
        "c = MPI.COMM_WORLD; e = read_job_env(os.environ); "
        "print(c.rank, c.size, c.allreduce(c.rank + 1), e.launcher.value, e.rank, e.local_rank, flush=True)"
    )
    out = run(slurm_env, "srun", "--mpi=pmi2", "-n", "4", "--time=2", sys.executable, "-c", probe, timeout=120)
    lines = sorted(out.splitlines())
    assert lines == [f"{r} 4 10 slurm {r} {r}" for r in range(4)], out


def test_submitted_job_trains_the_ensemble(slurm_env, jobs, tmp_path):
    spec = write_spec(tmp_path / "spec.yaml", epochs=2, models=2)
    run_dir = tmp_path / "run"
    job_id = submit(slurm_env, spec, run_dir, jobs)
    fields = wait_job(slurm_env, job_id, finished, "end")
    log = job_log(run_dir, job_id)
    assert (fields["JobState"], fields["ExitCode"]) == ("COMPLETED", "0:0"), log[-4000:]
    results = json.loads((run_dir / "results.json").read_text())
    assert sorted((m["id"], m["epochs"]) for m in results["models"]) == [("m0", 2), ("m1", 2)]
    assert not results.get("interrupted")
    assert "fleet: ensemble finished" in log


# The checkpoint signal to the batch shell, which passes it on to srun as USR1 (and srun to
# every rank): USR1 as --signal=B:USR1@120 sends it before the time limit; TERM as a site's
# preemption may send it.
CHECKPOINT_SIGNALS = {"usr1-warning": ["--signal=USR1", "--batch"], "term-to-batch-shell": ["--signal=TERM", "--batch"]}


@pytest.mark.parametrize("delivery", CHECKPOINT_SIGNALS)
def test_checkpoint_signal_requeues_and_the_job_resumes_without_losing_an_epoch(slurm_env, jobs, tmp_path, delivery):
    """The checkpoint signal as Slurm sends it (see CHECKPOINT_SIGNALS); fleet train
    checkpoints and exits 75; the script requeues the job; the requeued job resumes.

    Needs the runtime's checkpoint signal (fleet/runtime/launch/signals.py)."""
    epochs = 12
    run_dir, job_id = signal_after_the_first_epoch(slurm_env, jobs, tmp_path, epochs, CHECKPOINT_SIGNALS[delivery])

    requeued = wait_job(slurm_env, job_id, lambda f: f["Restarts"] == "1" and f["JobState"] == "PENDING" or finished(f),
                        "requeue")
    log = job_log(run_dir, job_id)[-4000:]
    assert requeued["JobState"] == "PENDING", log
    first = json.loads((run_dir / "results.json").read_text())
    assert first["interrupted"] is True, log
    saved, done_before = checkpointed_epochs(run_dir), epochs_logged(run_dir)
    assert saved and all(e < epochs for e in saved.values()), (saved, log)  # it stopped mid-run
    assert {m: max(e) for m, e in done_before.items()} == {m: e for m, e in saved.items() if e}, (saved, log)

    # Slurm holds a requeued job for cred_expire + 1 s (local cluster: 11 s; default 121 s).
    fields = wait_job(slurm_env, job_id, finished, "end after the requeue")
    log = job_log(run_dir, job_id)
    assert (fields["JobState"], fields["ExitCode"], fields["Restarts"]) == ("COMPLETED", "0:0", "1"), log[-4000:]
    assert "requeueing job" in log and "(restart 1)" in log
    results = json.loads((run_dir / "results.json").read_text())
    assert not results.get("interrupted")
    assert {m["id"]: m["epochs"] for m in results["models"]} == {f"m{i}": epochs for i in range(3)}
    # every epoch once: none completed before the signal was lost or trained again
    assert epochs_logged(run_dir) == {f"m{i}": list(range(1, epochs + 1)) for i in range(3)}


def test_walltime_kill_keeps_every_checkpointed_epoch_and_a_resubmitted_job_resumes(slurm_env, jobs, tmp_path):
    """At the time limit Slurm sends TERM to the batch shell, to srun and to every task at
    once (as `scancel --signal=TERM --full` does); srun answers TERM by killing the step, so
    the ranks get no time to checkpoint then (that is what the USR1 warning before the limit
    is for). Every epoch a model completed was checkpointed at its end: the same script
    submitted again resumes each model from there and finishes, every epoch trained once."""
    epochs = 12
    run_dir, job_id = signal_after_the_first_epoch(slurm_env, jobs, tmp_path, epochs, ["--signal=TERM", "--full"])
    ended = wait_job(slurm_env, job_id, finished, "end")
    log = job_log(run_dir, job_id)[-4000:]
    assert ended["JobState"] != "COMPLETED" and ended["Restarts"] == "0", (ended, log)
    saved = checkpointed_epochs(run_dir)
    assert saved and all(e < epochs for e in saved.values()), (saved, log)  # killed mid-run

    second = run(slurm_env, "sbatch", "--parsable", str(run_dir / "sbatch.sh")).strip().split(";")[0]
    jobs.append(second)
    fields = wait_job(slurm_env, second, finished, "end of the resubmitted job")
    log = job_log(run_dir, second)
    assert (fields["JobState"], fields["ExitCode"]) == ("COMPLETED", "0:0"), log[-4000:]
    results = json.loads((run_dir / "results.json").read_text())
    assert {m["id"]: m["epochs"] for m in results["models"]} == {f"m{i}": epochs for i in range(3)}
    for model in results["models"]:  # the history comes from the checkpoints: each epoch once
        assert [h["epoch"] for h in model["history"]] == list(range(1, epochs + 1)), model["id"]
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    second_job = max(i for i, e in enumerate(events) if e["event"] == "run_start")
    first_starts = {}  # a model checkpointed at a round's end of the second job resumes again later
    for e in events[second_job:]:
        if e["event"] == "member_start":
            first_starts.setdefault(e["model"], e["resume"])
    resumed = {m for m, resume in first_starts.items() if resume}
    assert resumed == {m for m, e in saved.items() if e > 0}, (resumed, saved, first_starts)


def test_a_job_larger_than_its_partition_is_refused_before_submitting(slurm_env, jobs, tmp_path):
    """The local cluster has one node: a 2-node spec would pend for ever (PartitionNodeLimit),
    so `fleet submit` stops with one line naming the field and the partition, exit 2, and
    submits nothing."""
    spec = write_spec(tmp_path / "spec.yaml", epochs=1, models=2)
    spec.write_text(spec.read_text().replace("nodes: 1", "nodes: 2"))
    before = subprocess.run(["squeue", "-h", "-o", "%i"], env=slurm_env, capture_output=True, text=True).stdout
    done = subprocess.run(
        [sys.executable, "-m", "fleet", "submit", str(spec), "--scheduler", "slurm", "--run-dir", str(tmp_path / "run"),
         "--time", "10"], env=slurm_env, capture_output=True, text=True, timeout=60, cwd=spec.parent)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "cluster.nodes: the spec asks for 2 nodes and partition 'debug' has 1 (sinfo)" in lines[0]
    after = subprocess.run(["squeue", "-h", "-o", "%i"], env=slurm_env, capture_output=True, text=True).stdout
    assert after == before
