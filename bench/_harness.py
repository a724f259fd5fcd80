"""What the benchmarks share: running a command to its end, a `fleet` command among them.

A command (`fleet run`, `mpiexec`, a plain Python process) runs in a process group of its own;
on timeout the whole group is stopped (mpiexec and every rank it started), and a timeout or a
failure ends the bench with a message that names the command and shows the end of its output.
Beside it: a run directory's results.json, the synthetic JPEG folder several benches train on,
a bench's working directory (`--keep DIR` or a temporary one) and three argparse types.

A bench script imports this module by name (`import _harness`): Python puts a script's own
folder, `bench/`, first on `sys.path`. `fleet`, `preprocess` and `profiler` are imported from
the installed package (`pip install -e .`, as `make venv` does; or `PYTHONPATH` set to a
checkout), in the bench and in every process it starts. This module imports only the standard
library and PyYAML: peers.py's driver processes import the benches' modules, and their start-up
is part of what that bench measures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import yaml

TAIL_CHARS = 3000  # characters of a failed command's stdout and of its stderr shown


@dataclass(frozen=True)
class Finished:
    """A command that ran to its end: its wall seconds and what it printed ("" when not captured)."""

    wall_s: float
    stdout: str
    stderr: str


@dataclass(frozen=True)
class FleetRun:
    """A `fleet run` that ran to its end: its results.json and the command's wall seconds."""

    results: dict
    wall_s: float


def run_to_end(command: list[str], what: str, timeout: float, env: dict | None = None,
               capture: bool = True) -> Finished:
    """Run `command` in a process group of its own until it exits; its wall seconds and output.

    Args:
        command: the program and its arguments.
        what: the command's name in a message, e.g. "fleet run".
        timeout: seconds it may take; past them the whole group is stopped.
        env: its environment (default: this process's).
        capture: keep its stdout and stderr (shown when it fails); False lets them through.

    A failure (non-zero exit) or a timeout ends the bench (`SystemExit`) with a message.
    """
    pipe = subprocess.PIPE if capture else None
    started = time.perf_counter()
    with subprocess.Popen(command, stdout=pipe, stderr=pipe, text=True, env=env, start_new_session=True) as process:
        try:
            out, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            stop_group(process.pid)
            out, err = process.communicate()
            sys.exit(f"{what} did not finish in {timeout:g} s: stopped it and every process it started"
                     f"{output_tail(out, err)}")
    wall = time.perf_counter() - started
    if process.returncode != 0:
        sys.exit(f"{what} failed (exit {process.returncode}){output_tail(out, err)}")
    return Finished(wall, out or "", err or "")


def stop_group(leader: int) -> None:
    """SIGKILL the process group that `leader` leads (mpiexec and every rank with it)."""
    with contextlib.suppress(ProcessLookupError):  # every process of the group has already exited
        os.killpg(leader, signal.SIGKILL)


def output_tail(out: str | None, err: str | None) -> str:
    """The last `TAIL_CHARS` of each captured stream, as the end of a message ("" if none)."""
    return "".join(f"\n{text[-TAIL_CHARS:].rstrip()}" for text in (out, err) if text)


def fleet_command(*args: str) -> list[str]:
    """`python -m fleet ARGS` with this interpreter."""
    return [sys.executable, "-m", "fleet", *args]


def fleet(*args: str, timeout: float, what: str | None = None) -> Finished:
    """A `fleet` CLI command run to its end (`run_to_end`); `what` defaults to the command line."""
    return run_to_end(fleet_command(*args), what or f"fleet {' '.join(args)}", timeout)


def fleet_run(spec: Path, run_dir: Path, timeout: float, *options: str, what: str = "fleet run") -> FleetRun:
    """`fleet run SPEC --run-dir RUN_DIR --quiet [OPTIONS]` to its end, and its results.json."""
    command = fleet_command("run", str(spec), "--run-dir", str(run_dir), "--quiet", *options)
    done = run_to_end(command, f"{what} (run directory {run_dir})", timeout)
    return FleetRun(read_results(run_dir), done.wall_s)


def read_results(run_dir: Path) -> dict:
    """A run directory's results.json."""
    return json.loads((Path(run_dir) / "results.json").read_text())


def jpeg_folder(folder: Path, samples: int, image_size: int) -> Path:
    """A synthetic image folder of JPEGs (10 classes, 3 channels), made once: a folder this
    made before (it holds a `.made` mark) is reused, anything else there is replaced."""
    from preprocess.make import make_synthetic  # Pillow and h5py: not at the start-up peers.py measures

    if not (folder / ".made").exists():
        shutil.rmtree(folder, ignore_errors=True)
        make_synthetic(folder, "jpeg", classes=10, samples=samples, image_size=image_size, channels=3,
                       progress=False)
        (folder / ".made").touch()
    return folder


@contextlib.contextmanager
def work_dir(keep: str | None) -> Iterator[Path]:
    """The bench's working directory, as an absolute path: `keep` (made if missing, kept
    afterwards) or, when `keep` is None, a temporary directory removed at the end."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(keep or tmp).resolve()
        root.mkdir(parents=True, exist_ok=True)
        yield root


def at_least(low: int, why: str = ""):
    """An argparse type: an integer no smaller than `low` (`why` says what needs it)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} is below {low}{why}")
        return value

    return parse


def name_list(choices: tuple[str, ...], what: str):
    """An argparse type: comma-separated names from `choices` (at least one), in their order
    there; `what` names them in the message, e.g. "policy"."""

    def parse(text: str) -> list[str]:
        chosen = [name.strip() for name in text.split(",") if name.strip()]
        unknown = [name for name in chosen if name not in choices]
        if unknown or not chosen:
            raise argparse.ArgumentTypeError(f"unknown {what} {', '.join(unknown) or '(none given)'} "
                                             f"(choose from {', '.join(choices)})")
        return [name for name in choices if name in chosen]

    return parse


def runtime_option(text: str) -> tuple[str, object]:
    """``poll=busy`` -> ("poll", "busy"); the value is read as YAML (numbers stay numbers)."""
    key, _, value = text.partition("=")
    return key, yaml.safe_load(value)
