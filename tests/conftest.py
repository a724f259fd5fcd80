import functools
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from fleet.runtime.launch.supervise import mpi_segments, remove_leftover_segments

REPO = Path(__file__).resolve().parent.parent


def run_fleet(*args: str, cwd: Path = REPO, timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run `python -m fleet ARGS` as a user would; returns the completed process (text)."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "fleet", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
    )


@pytest.fixture
def fleet_cli():
    return run_fleet


@functools.cache
def mpi_launcher() -> list[str]:
    """``[mpiexec, <local flags>]`` for tests that start real MPI jobs (skips without mpiexec)."""
    from fleet.errors import UserError
    from fleet.runtime.launch.mpiexec import find_mpiexec, launcher_for

    try:
        return launcher_for(find_mpiexec())
    except UserError:
        pytest.skip("no mpiexec beside sys.executable or on PATH")


def quiet_mpi_launcher() -> list[str]:
    """`mpi_launcher()`, with ``--quiet`` for Open MPI: its mpirun reports ranks that exit non-zero
    in a block of its own on stderr (MPICH's says nothing), which a test of fleet's one-line
    errors must not count. Not for `fleet run`: ``--quiet`` also hides a missing executable."""
    from fleet.runtime.launch.mpiexec import is_open_mpi, mpiexec_version

    launcher = mpi_launcher()
    return [*launcher, "--quiet"] if is_open_mpi(mpiexec_version(launcher[0])) else launcher


def fleet_under_mpi(ranks: int, *args: str) -> list[str]:
    """The command line of `fleet ARGS` on `ranks` ranks under a real mpiexec."""
    return [*mpi_launcher(), "-n", str(ranks), sys.executable, "-m", "fleet", *args]


def mpi_env(extra: dict | None = None) -> dict:
    """os.environ for a child mpiexec, passed explicitly: Open MPI's singleton MPI_Init (a test
    that imports mpi4py in this process) sets variables in the C environment, which a child's
    mpirun started with env=None would take for its own job's."""
    return {**os.environ, "PYTHONUNBUFFERED": "1", **(extra or {})}


def run_mpi(ranks: int, *args: str, timeout: float = 300, env: dict | None = None, cwd: Path = REPO):
    """`fleet ARGS` on `ranks` ranks under a real mpiexec; returns the completed process."""
    return subprocess.run(fleet_under_mpi(ranks, *args), cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env=mpi_env(env))


def _openmpi_session_dirs() -> set[Path]:
    """Open MPI's per-mpirun session directories, /tmp/ompi.HOST.UID/pid.PID."""
    return set(Path(tempfile.gettempdir()).glob("ompi.*/pid.*"))


@pytest.fixture(scope="session", autouse=True)
def remove_leaked_mpi_segments():
    """MPI unlinks its shared-memory segments in /dev/shm at MPI_Finalize; a job ended by
    SIGKILL or MPI_Abort (the tests that kill a job or time one out) leaves them behind, a few
    MB each, and /dev/shm is memory (Open MPI's mpirun also leaves its session directory in
    /tmp). Remove the ones this session created that no process uses any more."""
    before, sessions_before = mpi_segments(), _openmpi_session_dirs()
    yield
    remove_leftover_segments(before)
    for session in _openmpi_session_dirs() - sessions_before:
        if not Path("/proc", session.name.removeprefix("pid.")).exists():
            shutil.rmtree(session, ignore_errors=True)
