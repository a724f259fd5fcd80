"""Every hostile spec in tests/specs/bad gives exit 2 and one line naming the field, cheaply.

Each file's first line is ``# expect: <part of the one-line message>``. `fleet validate` runs
on each as a user would (in parallel), and each run must end with exit code 2, nothing on
stdout, one line on stderr (``fleet validate: error: ...``) holding the expected part, no
traceback, within `CPU_LIMIT_S` of CPU time and `RSS_LIMIT_MB` of memory (the process's own
peak, from ``wait4`` in a small parent, `MEASURE`). A run still going after `HANG_S` is killed:
a hang fails.
User models the specs name live in ``usermods/`` (imported from the repository's root).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import REPO

BAD = sorted((REPO / "tests" / "specs" / "bad").glob("*.yaml"))
CPU_LIMIT_S = 10.0
RSS_LIMIT_MB = 500.0
HANG_S = 180.0
SECTIONS = ("name", "seed", "run_dir", "framework", "data", "preprocess", "models", "train", "train.stop",
            "train.schedule", "scheduler", "cluster", "runtime")
NAMED = re.compile(r"^(\S+\.yaml(:\d+:\d+)?: |[A-Za-z_][\w.\[\]-]*(:( |$)| \())")


@dataclass(frozen=True)
class Outcome:
    returncode: int
    stdout: str
    stderr: str
    cpu_s: float
    max_rss_mb: float


MEASURE = """
import json, os, subprocess, sys
child = subprocess.Popen(sys.argv[2:])
_, status, usage = os.wait4(child.pid, 0)
with open(sys.argv[1], "w") as report:
    json.dump([os.waitstatus_to_exitcode(status), usage.ru_utime + usage.ru_stime, usage.ru_maxrss], report)
"""
"""Runs its command and writes [exit code, CPU seconds, peak RSS in KiB] of that process. Its own
start is small: a process forked straight from the test runner would count the runner's memory."""


def run_measured(*args: str, cwd: Path = REPO) -> Outcome:
    """`python -m fleet ARGS`, with the CPU time and peak memory of that process alone."""
    with tempfile.TemporaryDirectory() as scratch:
        report = Path(scratch) / "usage.json"
        proc = subprocess.Popen([sys.executable, "-c", MEASURE, str(report), sys.executable, "-m", "fleet", *args],
                                cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            out, err = proc.communicate(timeout=HANG_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            return Outcome(-signal.SIGKILL, out.decode(errors="replace"), err.decode(errors="replace"), HANG_S, 0.0)
        code, cpu_s, rss_kib = json.loads(report.read_text())
        return Outcome(code, out.decode(errors="replace"), err.decode(errors="replace"), cpu_s, rss_kib / 1024)


def expected_message(path: Path) -> str:
    first = path.read_bytes().decode("utf-8", "replace").splitlines()[0]
    assert first.startswith("# expect: "), f"{path.name} lacks its '# expect:' line"
    return first[len("# expect: "):]


def check_refused(result: Outcome, expected: str) -> None:
    assert result.returncode == 2, f"exit {result.returncode}: {result.stderr[-2000:]}"
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert lines[0].startswith("fleet validate: error: ")
    assert expected in lines[0]
    assert result.stdout == ""
    assert result.cpu_s < CPU_LIMIT_S, f"{result.cpu_s:.1f} s of CPU"
    assert result.max_rss_mb < RSS_LIMIT_MB, f"{result.max_rss_mb:.0f} MB"


def test_there_are_enough_bad_specs():
    assert len(BAD) >= 110


def test_each_expected_message_names_the_field_or_the_place():
    """``data.classes: ...``, ``models[1] (id, family): ...``, or ``spec.yaml:4:7: ...``."""
    for path in BAD:
        assert NAMED.match(expected_message(path)), f"{path.name}: its '# expect:' names no field"


def test_the_bad_specs_cover_every_section():
    """At least three specs name a field of each section (YAML errors name the file first)."""
    fields = [re.sub(r"^\S+\.yaml:\d+:\d+: ", "", expected_message(p)) for p in BAD]
    for section in SECTIONS:
        named = [f for f in fields if re.match(rf"{re.escape(section)}[.\[:]", f)]
        assert len(named) >= 3, f"{section}: only {named}"


@pytest.fixture(scope="module")
def outcomes():
    with ThreadPoolExecutor(max_workers=4) as pool:
        runs = pool.map(lambda p: run_measured("validate", str(p.relative_to(REPO))), BAD)
        return dict(zip(BAD, runs))


@pytest.mark.parametrize("path", BAD, ids=[p.stem for p in BAD])
def test_bad_spec_is_one_line_exit_2(path, outcomes):
    check_refused(outcomes[path], expected_message(path))


def billion_laughs(levels: int) -> str:
    lines = ["  l0: &l0 [" + ", ".join(["lol"] * 9) + "]"]
    lines += [f"  l{k}: &l{k} [" + ", ".join([f"*l{k - 1}"] * 9) + "]" for k in range(1, levels)]
    return "\n".join(lines) + "\n"


def test_a_10_mb_spec_and_a_billion_laughs_are_refused_at_once(tmp_path):
    """They took 71 s and 1.8 GB, and hung (the error path showed the expanded tree)."""
    head = "name: bad\ndata: {source: digits}\nmodels: [{family: mlp}]\n"
    big = tmp_path / "big.yaml"
    big.write_text(head + "notes: [" + ", ".join(["'a fairly long note'"] * 500_000) + "]\n")
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(head + "seed:\n" + billion_laughs(12))
    for path, expected in ((big, "more than 4 MiB"), (bomb, "seed.l5: its aliases expand it")):
        result = run_measured("validate", str(path))
        check_refused(result, expected)
        assert result.cpu_s < 3.0 and result.max_rss_mb < 150, (result.cpu_s, result.max_rss_mb)
