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
