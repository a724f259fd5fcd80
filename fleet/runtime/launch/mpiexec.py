"""`fleet run` outside MPI: the mpiexec command line that starts every rank of a run."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path

from fleet.errors import UserError
from fleet.runtime.launch.jobenv import read_job_env, without_allocation
from fleet.runtime.launch.supervise import JobWatch, Outcome
from fleet.spec import Spec

DEFAULT_PREPROCESSORS = 1  # per node, when the spec says auto and nothing else decides


def ranks_per_node(spec: Spec) -> int:
    preprocessors = spec.cluster.preprocessors_per_node
    if preprocessors == "auto":
        preprocessors = DEFAULT_PREPROCESSORS
    return spec.cluster.gpus_per_node + preprocessors


def local_launch_flags(mpiexec_version: str) -> list[str]:
    """Flags that make an mpiexec start every rank on this machine, more ranks than cores allowed.

    MPICH's Hydra: ``-launcher fork`` (stay local even inside a Slurm allocation). Open MPI:
    ``--oversubscribe`` (it refuses more ranks than cores otherwise).
    """
    if "HYDRA" in mpiexec_version or "MPICH" in mpiexec_version:
        return ["-launcher", "fork"]
    if is_open_mpi(mpiexec_version):
        return ["--oversubscribe"]
    return []


def is_open_mpi(mpiexec_version: str) -> bool:
    """Whether ``mpiexec --version`` printed this (``mpiexec (OpenRTE) 4.1.4``, ``(Open MPI) 5.0.3``)."""
    return "Open MPI" in mpiexec_version or "OpenRTE" in mpiexec_version


def mpiexec_version(mpiexec: str) -> str:
    import subprocess

    try:
        done = subprocess.run([mpiexec, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout + done.stderr


def launcher_for(mpiexec: str) -> list[str]:
    """``[mpiexec, <flags to run locally>]``: what `mpiexec_command` starts with."""
    return [mpiexec, *local_launch_flags(mpiexec_version(mpiexec))]


def mpiexec_command(
    spec: Spec, spec_path: str, launcher: list[str], python: str, quiet: bool = False, device: str | None = None,
    calibrate_from: str | None = None,
) -> list[str]:
    """`launcher` (see `launcher_for`) running `fleet train` on all ranks of `spec` on this machine.

    A spec with several nodes runs them as virtual nodes (consecutive ranks form a node).
    """
    per_node = ranks_per_node(spec)
    command = [*launcher, "-n", str(spec.cluster.nodes * per_node), python, "-m", "fleet", "train", spec_path,
               "--run-dir", spec.run_dir]
    if spec.cluster.nodes > 1:
        command += ["--ranks-per-node", str(per_node)]
    if quiet:
        command.append("--quiet")
    if device:
        command += ["--device", device]
    if calibrate_from:
        command += ["--calibrate-from", calibrate_from]
    return command


def start_here(command: list[str], what: str, run_dir: str | os.PathLike, start_timeout_s: float | None = None,
               environ: Mapping[str, str] = os.environ) -> Outcome:
    """Print `what` and the command line, run `command` (an `mpiexec_command`) under a
    `JobWatch` and return how it ended; every rank starts on this machine (the job is stopped
    when none has finished starting after `start_timeout_s`).

    The batch allocation's variables are hidden from the mpiexec (`without_allocation`), so
    inside a multi-node Slurm/LSF/PBS allocation neither MPICH nor Open MPI reaches for the
    other nodes. The environment passed is Python's ``os.environ``: an MPI library that this
    process initialised may have set variables in the C environment that an mpirun would take
    for its own job's.
    """
    note = allocation_note(environ)
    if note:
        print(note, flush=True)
    print(f"fleet: {what}: {' '.join(command)}", flush=True)
    watch = JobWatch(command, Path(run_dir), without_allocation(environ), sys.stdout, sys.stderr, start_timeout_s)
    return watch.run()


def allocation_note(environ: Mapping[str, str] = os.environ) -> str | None:
    """A line for the user when `fleet run` starts inside a batch job of several nodes."""
    job = read_job_env(environ)
    nodes = job.job_nodes or (len(job.job_hosts) if job.job_hosts else 0)
    if nodes <= 1:
        return None
    return (f"fleet: {job.scheduler.value} job {job.job_id} has {nodes} nodes; this command starts every rank "
            "on this one (for all of them: `fleet submit`, or `fleet train` under srun/jsrun)")


def find_mpiexec(python: str = sys.executable, environ: Mapping[str, str] = os.environ) -> str:
    """``$FLEET_MPIEXEC`` when set (a path, or a name on PATH), else the mpiexec beside this
    Python (the mpich wheel's), else the first on PATH."""
    chosen = environ.get("FLEET_MPIEXEC")
    if chosen:
        found = shutil.which(chosen)
        if found is None:
            raise UserError(f"FLEET_MPIEXEC: {chosen!r} is not an executable file or a command on PATH")
        return found
    beside = Path(python).parent / "mpiexec"
    if beside.exists():
        return str(beside)
    found = shutil.which("mpiexec")
    if found is None:
        raise UserError("no mpiexec found: `pip install mpich` (workstations) or load your site's MPI module")
    return found
