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
