import functools
import os
import subprocess
import sys
from pathlib import Path

import pytest

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
    from fleet.runtime.launch import find_mpiexec, launcher_for

    try:
        return launcher_for(find_mpiexec())
    except UserError:
        pytest.skip("no mpiexec beside sys.executable or on PATH")


def run_mpi(ranks: int, *args: str, timeout: float = 300, env: dict | None = None, cwd: Path = REPO):
    """`fleet ARGS` on `ranks` ranks under a real mpiexec; returns the completed process."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    command = [*mpi_launcher(), "-n", str(ranks), sys.executable, "-m", "fleet", *args]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=full_env)


SHM = Path("/dev/shm")


def _mpich_segments() -> set[str]:
    try:
        return {p.name for p in SHM.iterdir() if p.name.startswith("mpich_shm_")}
    except OSError:
        return set()


def _mapped_names() -> str:
    """Every process's memory maps, as one string (to see whether a segment is still in use)."""
    maps = []
    for proc in Path("/proc").iterdir():
        try:
            maps.append((proc / "maps").read_text())
        except (OSError, UnicodeDecodeError):
            continue
    return "".join(maps)


@pytest.fixture(scope="session", autouse=True)
def remove_leaked_mpich_segments():
    """MPICH unlinks its shared-memory segment in /dev/shm at MPI_Finalize; a job ended by
    SIGKILL or MPI_Abort (the tests that kill a job or time one out) leaves it behind, a few
    MB each, and /dev/shm is memory. Remove the ones this session created that no process
    maps any more."""
    before = _mpich_segments()
    yield
    leaked = _mpich_segments() - before
    if not leaked:
        return
    in_use = _mapped_names()
    for name in leaked:
        if name not in in_use:
            (SHM / name).unlink(missing_ok=True)
