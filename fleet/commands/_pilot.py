"""`fleet profile --pilot SECONDS`: a short real run after the profile, whose measured costs
calibrate every prediction made from the profile.

The profile times each model's steps and one preprocessor's decoding, each on its own; a run
also pays what those leave out (what a trainer does outside its steps, a preprocessor's
hand-offs and waits, the coordinator, start-up, checkpoints, and on CPU nodes everything
sharing the cores). The pilot is `fleet run` of the same spec in ``RUN_DIR/pilot`` (with the
profile just made), stopped by the checkpoint signal `seconds` after its training started (or
finished before). What its ``results.json`` measured (``prediction.measured``, ``overhead_s``)
goes into ``profile.json`` as its ``pilot`` block: the dry run, `policy: auto` and a run's
forecast then predict with it (`fleet.schedule.calibration`), as a repeated run does with
``--calibrate-from``.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from fleet.atomic import atomic_write_json
from fleet.errors import UserError
from fleet.runtime.events import read_events
from fleet.runtime.launch.signals import EXIT_CHECKPOINTED
from fleet.schedule_io import PILOT

PILOT_DIR = "pilot"
MARKER = ".fleet-pilot"  # a pilot directory fleet made (and may replace)
POLL_S = 0.2


def run_pilot(spec_path: str, run_dir: Path, seconds: float, device: str | None, start_timeout_s: float) -> dict:
    """Run the pilot and write its block into ``run_dir/profile.json``; returns the block.

    Raises:
        UserError: the pilot directory is someone else's, or the pilot run failed.
    """
    pilot = _fresh_pilot_dir(run_dir)
    shutil.copy2(run_dir / "profile.json", pilot / "profile.json")
    command = [sys.executable, "-m", "fleet", "run", spec_path, "--run-dir", str(pilot), "--quiet"]
    if device:
        command += ["--device", device]
    print(f"fleet: pilot: a run of the spec in {pilot}, stopped {seconds:g} s after its training starts", flush=True)
    with open(pilot / "pilot.log", "w", encoding="utf-8") as log:
        job = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        try:
            code = _stop_after(job, pilot, seconds, start_timeout_s)
        finally:
            if job.poll() is None:
                job.kill()
    if code not in (0, EXIT_CHECKPOINTED):
        raise UserError(f"pilot: the pilot run in {pilot} failed (exit code {code}); see {pilot / 'pilot.log'}")
    block = _pilot_block(pilot, seconds)
    profile = json.loads((run_dir / "profile.json").read_text(encoding="utf-8"))
    atomic_write_json(run_dir / "profile.json", {**profile, PILOT: block})
    return block


def _fresh_pilot_dir(run_dir: Path) -> Path:
    pilot = run_dir / PILOT_DIR
    if pilot.exists():
        if not (pilot / MARKER).exists():
            raise UserError(f"pilot: {pilot} exists and is not a pilot fleet made; move it away or choose another "
                            "--run-dir")
        shutil.rmtree(pilot)
    pilot.mkdir(parents=True)
    (pilot / MARKER).write_text("made by fleet profile --pilot; replaced by the next pilot\n", encoding="utf-8")
    return pilot


def _stop_after(job: subprocess.Popen, pilot: Path, seconds: float, start_timeout_s: float) -> int:
    """Wait for the run's training to start, give it `seconds`, then send `fleet run` the
    checkpoint signal (it forwards TERM to its ranks as USR1); its exit code."""
    deadline = time.monotonic() + start_timeout_s
    while job.poll() is None and not _started(pilot):
        if time.monotonic() > deadline:
            job.send_signal(signal.SIGTERM)
            raise UserError(f"pilot: the pilot run did not start training within {start_timeout_s:g} s; "
                            f"see {pilot / 'pilot.log'}")
        time.sleep(POLL_S)
    stop_at = time.monotonic() + seconds
    while job.poll() is None and time.monotonic() < stop_at:
        time.sleep(POLL_S)
    if job.poll() is None and not _logged(pilot, "run_end"):  # a run that trained everything is left to end
        job.send_signal(signal.SIGTERM)
    return job.wait(timeout=start_timeout_s)


def _started(pilot: Path) -> bool:
    return _logged(pilot, "run_start")


def _logged(pilot: Path, event: str) -> bool:
    return any(e.get("event") == event for e in read_events(pilot / "events.jsonl"))


def _pilot_block(pilot: Path, seconds: float) -> dict:
    """``profile.json``'s pilot block from the pilot's results.json."""
    path = pilot / "results.json"
    try:
        results = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise UserError(f"pilot: cannot read {path} ({exc})") from None
    measured = results.get("prediction", {}).get("measured") if isinstance(results.get("prediction"), dict) else None
    if not isinstance(measured, dict):
        raise UserError(f"pilot: {path} holds no prediction.measured")
    started = [e for e in read_events(pilot / "events.jsonl") if e.get("event") == "run_start"]
    device = started[0].get("device") if started else None
    return {"seconds": seconds, "run_dir": PILOT_DIR, "device": device, "policy": results.get("policy"),
            "makespan_s": results.get("makespan_s"), "interrupted": results.get("interrupted"),
            "measured": measured, "overhead_s": results.get("overhead_s", {})}
