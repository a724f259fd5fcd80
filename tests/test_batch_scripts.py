"""The rendered batch scripts, run by bash.

With stand-ins for srun/jsrun and scontrol/brequeue, the scripts' own logic: the checkpoint
signal reaches the launcher, `wait` survives a trapped signal, exit 75 requeues the job.
Then the LSF script for real, its jsrun line run through tests/shims/jsrun (an ERF -> one MPMD
mpiexec section per rank) on a tiny ensemble.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import REPO, mpi_launcher
from fleet.batch import BatchJob, BatchSystem, SubmitOptions, batch_job, render, script_path
from fleet.batch.render import render_erf
from fleet.spec import load_spec

SHIMS = REPO / "tests" / "shims"

# A launcher stand-in: exits $FAKE_EXIT at once, or with FAKE_EXIT=wait waits for USR1/TERM,
# records it, lingers $FAKE_LINGER seconds (a checkpoint), then exits 75.
FAKE_LAUNCHER = """#!/usr/bin/env bash
echo "$*" > "$FAKE_DIR/launcher.args"
[ "$FAKE_EXIT" = wait ] || exit "$FAKE_EXIT"
got=
trap 'got="$got USR1"' USR1
trap 'got="$got TERM"' TERM
touch "$FAKE_DIR/ready"
while [ -z "$got" ]; do sleep 0.05; done
sleep "${FAKE_LINGER:-0}"
echo $got > "$FAKE_DIR/launcher.signals"
exit 75
"""
FAKE_REQUEUE = """#!/usr/bin/env bash
echo "$*" > "$FAKE_DIR/requeue.args"
exit "${FAKE_REQUEUE_EXIT:-0}"
"""
LAUNCHERS = {"slurm": ("srun", "scontrol"), "lsf": ("jsrun", "brequeue")}
JOB_ENV = {"slurm": {"SLURM_JOB_ID": "1234", "SLURM_JOB_NODELIST": "n1"}, "lsf": {"LSB_JOBID": "1234"}}


def write_spec(tmp_path: Path, epochs: int = 1) -> Path:
    doc = {
        "name": "tiny", "seed": 1, "data": {"source": "digits", "val_fraction": 0.2},
        "models": [{"family": "mlp", "name": "a", "params": {"hidden": [16]}},
                   {"family": "mlp", "name": "b", "params": {"hidden": [32]}}],
        "train": {"batch_size": 32, "max_epochs": epochs, "optimizer": "adam", "lr": 0.01},
        "scheduler": {"profile": False},  # rates from FLOPs: no profiling pass before training
        "cluster": {"nodes": 1, "gpus_per_node": 2, "preprocessors_per_node": 1, "device": "cpu"},
        "runtime": {"timeout_s": 120},
    }
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def write_script(tmp_path: Path, system: str) -> Path:
    spec_path = write_spec(tmp_path)
    spec = load_spec(spec_path, run_dir=str(tmp_path / "run"))
    job = batch_job(spec, str(spec_path), SubmitOptions(BatchSystem(system)), str(tmp_path), sys.executable)
    path = Path(script_path(job))
    path.parent.mkdir(parents=True)
    path.write_text(render(job))
    return path


@pytest.fixture(params=["slurm", "lsf"])
def scripted(request, tmp_path):
    """(system, script, start(exit, **env) -> Popen, fake dir) with a stand-in launcher and requeue."""
    system = request.param
    fake = tmp_path / "fake"
    fake.mkdir()
    launcher, requeue = LAUNCHERS[system]
    for name, text in ((launcher, FAKE_LAUNCHER), (requeue, FAKE_REQUEUE)):
        (fake / name).write_text(text)
        (fake / name).chmod(0o755)
    script = write_script(tmp_path, system)

    def start(exit: str, **env: str) -> subprocess.Popen:
        full = {"PATH": f"{fake}:/usr/bin:/bin", "FAKE_DIR": str(fake), "FAKE_EXIT": exit, **JOB_ENV[system], **env}
        return subprocess.Popen(["bash", str(script)], env=full, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)

    return system, script, start, fake


def wait_for(path: Path, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.05)


def test_finished_ensemble_exits_0_without_requeue(scripted):
    system, script, start, fake = scripted
    proc = start("0")
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0 and "ensemble finished" in out, out
    assert not (fake / "requeue.args").exists()
    assert "train" in (fake / "launcher.args").read_text()


def test_failure_is_passed_on_without_requeue(scripted):
    system, script, start, fake = scripted
    proc = start("3")
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 3 and "exited with status 3" in out, out
    assert not (fake / "requeue.args").exists()


@pytest.mark.parametrize("signum", [signal.SIGUSR1, signal.SIGTERM])
def test_checkpoint_signal_reaches_the_launcher_and_75_requeues(scripted, signum):
    system, script, start, fake = scripted
    proc = start("wait")
    wait_for(fake / "ready")
    proc.send_signal(signum)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert (fake / "launcher.signals").read_text().split() == ["USR1"]  # TERM goes on as USR1
    assert (fake / "requeue.args").read_text().split()[-1] == "1234"
    assert "checkpointed, not finished" in out


def test_wait_outlasts_a_second_signal_during_the_checkpoint(scripted):
    system, script, start, fake = scripted
    proc = start("wait", FAKE_LINGER="1.5")
    wait_for(fake / "ready")
    proc.send_signal(signal.SIGUSR1)
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)  # the walltime's TERM while the ranks still checkpoint
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert (fake / "requeue.args").exists(), out


def test_failed_requeue_exits_75(scripted):
    system, script, start, fake = scripted
    proc = start("wait", FAKE_REQUEUE_EXIT="1")
    wait_for(fake / "ready")
    proc.send_signal(signal.SIGUSR1)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 75, out
    assert "failed" in out


# --- the LSF script for real, through the jsrun shim ----------------------------------------------


def shim_env(**extra: str) -> dict:
    return {**os.environ, "PATH": f"{SHIMS}:{os.environ['PATH']}", "JSRUN_SHIM_MPIEXEC": " ".join(mpi_launcher()),
            **extra}


@pytest.mark.openmpi
@pytest.mark.mpi
def test_lsf_script_trains_through_the_jsrun_shim(tmp_path):
    script = write_script(tmp_path, "lsf")
    log = tmp_path / "jsrun.log"
    env = shim_env(LSB_JOBID="42", PYTHONUNBUFFERED="1", JSRUN_SHIM_LOG=str(log))
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "ensemble finished" in done.stdout
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert sorted((m["id"], m["epochs"]) for m in results["models"]) == [("a", 1), ("b", 1)]
    spec = load_spec(tmp_path / "spec.yaml", run_dir=str(tmp_path / "run"))
    job = batch_job(spec, "spec.yaml", SubmitOptions(BatchSystem.LSF), str(tmp_path), sys.executable)
    erf = tmp_path / "run" / "jsrun.erf"
    assert erf.read_text() == render_erf(job)
    args, *ranks = log.read_text().splitlines()
    assert args.split()[:5] == ["--erf_input", str(erf), sys.executable, "-m", "fleet"]
    # a CPU job: 1 preprocessor + 2 trainers on host 1, none with a GPU
    assert ranks == [f"rank {r} host 1 local {r} gpu -" for r in range(3)]


# Each rank: its MPI rank, CUDA_VISIBLE_DEVICES and JSM_NAMESPACE_*; rank 0 prints them all.
PROBE = """import json, os
from mpi4py import MPI
world = MPI.COMM_WORLD
seen = {"mpi": world.rank, "gpus": os.environ.get("CUDA_VISIBLE_DEVICES"),
        **{k: os.environ.get(f"JSM_NAMESPACE_{k.upper()}") for k in ("rank", "size", "local_rank")}}
every = world.gather(seen)
world.rank or print(json.dumps(every))
"""


@pytest.mark.openmpi
@pytest.mark.mpi
def test_jsrun_shim_gives_each_erf_rank_its_gpu(tmp_path):
    job = BatchJob(BatchSystem.LSF, "t", str(tmp_path / "s.yaml"), str(tmp_path), str(tmp_path), nodes=2,
                   trainers_per_node=2, preprocessors_per_node=1, gpus_per_node=2, cpus_per_task=1)
    erf = tmp_path / "jsrun.erf"
    erf.write_text(render_erf(job))
    command = [str(SHIMS / "jsrun"), "--erf_input", str(erf), "--smpiargs=-disable_gpu_hooks", sys.executable, "-c", PROBE]
    done = subprocess.run(command, env=shim_env(CUDA_VISIBLE_DEVICES="0,1,2,3"), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    # per node: the preprocessor sees no GPU, trainers 0 and 1 their own; MPI ranks are the ERF's
    assert [(s["mpi"], s["gpus"]) for s in seen] == [(0, ""), (1, "0"), (2, "1"), (3, ""), (4, "0"), (5, "1")]
    assert [(s["rank"], s["size"], s["local_rank"]) for s in seen] == [
        (str(r), "6", str(r % 3)) for r in range(6)
    ]


@pytest.mark.parametrize("lines, message", [
    (["rank: 0: { host: 1; cpu: {0-3} }", "rank: 2: { host: 1; cpu: {4-7} }"], "rank 1 is missing"),
    (["rank: 0: { host: 1; cpu: {0-3} }", "rank: 0: { host: 1; cpu: {4-7} }"], "rank 0 is listed twice"),
    (["cpu_index_using: logical"], "no rank lines"),
])
def test_jsrun_shim_refuses_a_malformed_erf(tmp_path, lines, message):
    erf = tmp_path / "jsrun.erf"
    erf.write_text("".join(line + "\n" for line in lines))
    done = subprocess.run([str(SHIMS / "jsrun"), "--erf_input", str(erf), "true"],
                          env={**os.environ, "JSRUN_SHIM_MPIEXEC": "false"}, capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and message in done.stderr, done.stderr


def test_a_partition_too_small_for_the_job_is_named_from_sinfo():
    from fleet.batch.submit import partition_verdict

    sinfo = "debug*|4|1-infinite\ngpu|16|1-8\ngpu|2|1-8\n"
    assert partition_verdict(sinfo, None, 4) is None
    assert partition_verdict(sinfo, None, 5) == "the spec asks for 5 nodes and partition 'debug' has 4 (sinfo)"
    assert partition_verdict(sinfo, "gpu", 8) is None  # 18 nodes in two rows (states), jobs of up to 8
    assert partition_verdict(sinfo, "gpu", 9) == "the spec asks for 9 nodes and partition 'gpu' takes jobs of at most 8 (sinfo)"
    assert partition_verdict(sinfo, "other", 100) is None  # sinfo does not say: submit and let Slurm judge
    assert partition_verdict("garbage", None, 3) is None
