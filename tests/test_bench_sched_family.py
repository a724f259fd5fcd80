"""bench/sched_family.py on a tiny cell (a smoke run of the script as a user runs it) and its
verdicts against the targets (pure)."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from fleet.schedule.workload_family import FamilyCell

BENCH = Path(__file__).resolve().parent.parent / "bench"


@pytest.fixture(scope="module")
def bench():
    """bench/sched_family.py, imported as the script is run: with bench/ first on sys.path (it
    imports `sched_paper` by name)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(BENCH))
        yield importlib.import_module("sched_family")


def outcome(bench, ratio: float, estimates: str = "exact", policy: str = "fleet-adaptive", failure: str = ""):
    return bench.Outcome(FamilyCell("uniform", 1.0, 4), estimates, 1000, policy, ratio, 5.0, 0.1, 10, failure)


def test_a_cell_meets_its_target_only_within_the_mean_and_the_worst(bench):
    noisy = next(label for label in bench.ESTIMATES if label != "exact")
    assert bench._verdict([outcome(bench, 1.05), outcome(bench, 1.14)], "exact") == "met"
    assert bench._verdict([outcome(bench, 1.02), outcome(bench, 1.16)], "exact") == "**missed**"  # worst > 1.15
    assert bench._verdict([outcome(bench, 1.11), outcome(bench, 1.11)], "exact") == "**missed**"  # mean > 1.10
    assert bench._verdict([outcome(bench, 1.12, noisy), outcome(bench, 1.17, noisy)], noisy) == "met"  # mean only
    failed = outcome(bench, float("nan"), failure="RecursionError: too deep")
    assert bench._verdict([outcome(bench, 1.0), failed], "exact") == "**failed**"
    assert bench._mean_worst([outcome(bench, 1.0), failed]) == "1.000 (1.000) **1 failed**"


def test_the_grid_is_shape_by_gpus_per_node_by_ratio(bench):
    grid = bench.cells()
    assert len(grid) == 4 * 2 * 4 and len(set(grid)) == len(grid)
    assert {c.gpus_ratio for c in grid} == {0.25, 0.5, 1.0, 2.0} and {c.gpus_per_node for c in grid} == {4, 8}


def test_the_script_prints_its_tables_for_a_tiny_cell(tmp_path):
    done = subprocess.run(
        [sys.executable, str(BENCH / "sched_family.py"), "--instances", "2", "--models", "8", "--shapes", "heavy",
         "--ratios", "0.5", "--gpus-per-node", "4", "--jobs", "1"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    rows = [line for line in out.splitlines() if line.startswith("| heavy | 4 | 0.5 |")]
    assert len(rows) == 2 and "exact" in rows[0] and "x U(0.7,1.3)" in rows[1]
    for row in rows:
        mean, worst = (float(x.strip("()")) for x in row.split("|")[5].split())
        assert 1.0 - 1e-9 <= mean <= worst  # never under the lower bound
    assert "seeds 1000-1001" in out and "of 1 cells met" in out
    assert "| 0.5 | 4 |" in out  # the planning table: 2 instances x 2 estimate models
