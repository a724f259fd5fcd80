"""Early stopping across models under a real mpiexec: rung decisions carried out by the
runtime, recorded before they act, and kept across checkpoint signals.

The emulated device's learning curves are scripted (each model's accuracy per epoch depends
on the model and the epoch only), so the rule can be checked against the recorded order.
"""

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from test_runtime_mpi import (
    digits_train_size,
    epochs_by_model,
    events,
    job_log,
    kill_job,
    rank_pids,
    results,
    start_train,
    write_profile,
    write_spec,
)

pytestmark = [pytest.mark.mpi, pytest.mark.slow]

MODELS = [f"m{i:02d}" for i in range(8)]
MAX_EPOCHS = 6
REDUCTION = 2


def early_stop_run(tmp_path: Path, method: str, policy: str, gpus: int = 3) -> tuple[Path, Path]:
    """8 emulated models of 6 epochs on `gpus` trainers, with `method` at rungs 1, 2, 4."""
    rng = np.random.default_rng(5)
    rates = {m: float(rng.uniform(2500, 5000)) for m in MODELS}
    spec = write_spec(tmp_path / "s.yaml", [{"family": "mlp", "name": m} for m in MODELS],
                      {"nodes": 1, "gpus_per_node": gpus, "preprocessors_per_node": 1, "device": "emulated"}, policy,
                      train={"batch_size": 32, "max_epochs": MAX_EPOCHS},
                      scheduler={"early_stop": {"method": method, "min_epochs": 1, "reduction": REDUCTION}})
    run_dir = tmp_path / "run"
    write_profile(run_dir, rates, {m: MAX_EPOCHS for m in MODELS}, gpus, digits_train_size(0.2, 1), gpus)
    return spec, run_dir


def rung_records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "rungs.jsonl").read_text().splitlines()]


def logged_epochs(run_dir: Path) -> int:
    return sum(len(v) for v in epochs_by_model(run_dir).values()) if (run_dir / "events.jsonl").exists() else 0


def start_and_signal(spec: Path, run_dir: Path, ranks: int, more_epochs: int) -> int:
    """Start the job, send the checkpoint signal once it has logged `more_epochs` more epochs
    (unless it ends first); returns its exit code (0 finished, 75 checkpointed)."""
    target = logged_epochs(run_dir) + more_epochs
    job = start_train(ranks, spec, run_dir)
    try:
        deadline = time.monotonic() + 240
        while job.poll() is None and logged_epochs(run_dir) < target and time.monotonic() < deadline:
            time.sleep(0.02)
        if job.poll() is None:
            for pid in rank_pids(run_dir):
                os.kill(pid, signal.SIGUSR1)
        job.wait(timeout=120)
    finally:
        if job.poll() is None:
            kill_job(job)
    assert job.returncode in (0, 75), job_log(run_dir).read_text()[-3000:]
    return job.returncode


def accuracy_at(run_dir: Path) -> dict[tuple[str, int], float]:
    """Every model's validation accuracy per epoch, as its epochs reported it (any start)."""
    return {(e["model"], e["epoch"]): e["val_accuracy"] for e in events(run_dir) if e["event"] == "epoch"}


def check_asha(records: list[dict], accuracy: dict) -> None:
    """Each verdict obeys ASHA given the arrivals recorded before it at its rung."""
    arrivals: dict[int, list[float]] = {}
    for r in records:
        assert r["verdict"] in ("continue", "stopped"), r
        assert math.isclose(r["metric"], -accuracy[(r["model"], r["rung"])]), r
        seen = arrivals.setdefault(r["rung"], [])
        seen.append(r["metric"])
        n = len(seen)
        if n < REDUCTION:
            assert r["verdict"] == "continue", r
            continue
        keep = max(1, n // REDUCTION)
        place = sorted(range(n), key=lambda i: (seen[i], i)).index(n - 1)
        assert r["verdict"] == ("continue" if place < keep else "stopped"), (r, seen)


def check_sha(records: list[dict], accuracy: dict) -> None:
    """Every model reaching a rung is paused there; once every model expected has reported,
    the top 1/η are promoted and the rest stopped."""
    rungs = sorted({r["rung"] for r in records})
    expected = set(MODELS)
    for rung in rungs:
        here = [r for r in records if r["rung"] == rung]
        paused = [r["model"] for r in here if r["verdict"] == "paused"]
        assert sorted(paused) == sorted(expected), (rung, paused, expected)
        metrics = {r["model"]: -accuracy[(r["model"], rung)] for r in here if r["verdict"] == "paused"}
        order = sorted(paused, key=lambda m: (metrics[m], paused.index(m)))
        keep = set(order[:max(1, len(order) // REDUCTION)])
        promoted = {r["model"] for r in here if r["verdict"] == "promoted"}
        stopped = {r["model"] for r in here if r["verdict"] == "stopped"}
        assert promoted == keep and stopped == set(paused) - keep, (rung, promoted, stopped, metrics)
        expected = keep


@pytest.mark.parametrize("method, policy", [("asha", "fleet-adaptive"), ("asha", "fleet-g"),
                                            ("sha", "fleet-adaptive"), ("sha", "fleet-g")])
def test_rung_decisions_survive_checkpoint_signals(tmp_path, method, policy):
    """A job signalled again and again (the walltime's checkpoint signal, every couple of
    epochs) re-makes no decision and loses none: the records number 0, 1, ... without a
    (model, rung) decided twice, the final set obeys the rule given the recorded order, and
    every model's epochs were trained once each, ending where its last verdict says."""
    spec, run_dir = early_stop_run(tmp_path, method, policy)
    codes = [start_and_signal(spec, run_dir, 4, 3)]
    while codes[-1] != 0 and len(codes) < 15:
        codes.append(start_and_signal(spec, run_dir, 4, 6))
    assert codes[-1] == 0 and 75 in codes, codes
    records = rung_records(run_dir)
    assert [r["seq"] for r in records] == list(range(len(records)))
    decided = [(r["model"], r["rung"], r["verdict"]) for r in records]
    assert len(set(decided)) == len(decided), "a decision was made twice"
    accuracy = accuracy_at(run_dir)
    (check_asha if method == "asha" else check_sha)(records, accuracy)
    final = {m["id"]: m for m in results(run_dir)["models"]}
    stopped = {r["model"]: r for r in records if r["verdict"] == "stopped"}
    for model, result in final.items():
        assert [h["epoch"] for h in result["history"]] == list(range(1, result["epochs"] + 1)), model
        assert result["converged"], model
        if model in stopped:
            assert result["stop_reason"] == "early_stop" and result["epochs"] == stopped[model]["rung"], result
            assert result["rung"] == stopped[model]["index"]
        else:
            assert result["epochs"] == MAX_EPOCHS, result
    assert len(stopped) >= len(MODELS) // 2
    assert all(e == sorted(set(e)) for e in epochs_by_model(run_dir).values())


def test_a_resumed_run_with_another_early_stop_setting_is_refused_in_one_line(tmp_path):
    spec, run_dir = early_stop_run(tmp_path, "asha", "fleet-g")
    assert start_and_signal(spec, run_dir, 4, 2) == 75
    spec.write_text(spec.read_text().replace("reduction: 2", "reduction: 3"))
    done = subprocess.run([sys.executable, "-m", "fleet", "run", str(spec), "--run-dir", str(run_dir)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert len(lines) == 1 and "scheduler.early_stop" in lines[0] and "early_stop.json" in lines[0], lines
