"""What `fleet run` and `fleet profile` say and write when their mpiexec has ended."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from fleet.runtime.control.setup import results_from_log
from fleet.runtime.launch.signals import EXIT_CHECKPOINTED
from fleet.runtime.launch.supervise import Outcome
from fleet.spec import Spec

EXPECTED = (0, 2, EXIT_CHECKPOINTED)  # done; a user error (said by the ranks); checkpointed


def start_timeout(spec: Spec) -> float:
    """How long `fleet run` waits for the ranks to start: their own wait, and a minute more."""
    return spec.runtime.timeout_s + 60.0


def finish(spec: Spec, outcome: Outcome, training: bool) -> int:
    """Explain an abnormal end, write what can be written, and return the exit code."""
    run_dir = Path(spec.run_dir)
    if outcome.repeats:
        print(f"fleet: (the same error on {outcome.repeats} more rank(s))", file=sys.stderr)
    if outcome.aside and run_dir.is_dir():
        (run_dir / "launcher.log").write_text("\n".join(outcome.aside) + "\n", encoding="utf-8")
    code = outcome.returncode
    if code not in EXPECTED:
        line = _what_happened(outcome)
        print(line, file=sys.stderr, flush=True)
        _append_error_log(run_dir, line)
        if training and run_dir.is_dir():
            _write_partial_results(spec, run_dir)
        print(f"fleet: completed epochs are checkpointed; run the same command again with the same run "
              f"directory ({run_dir}) to resume", file=sys.stderr, flush=True)
    return code if code >= 0 else 128 - code


def _what_happened(outcome: Outcome) -> str:
    code = outcome.returncode
    how = outcome.exit_string or (f"signal {-code}" if code < 0 else f"exit code {code}")
    said = " (see its error above)" if outcome.fleet_errors else "; no rank said why"
    if outcome.forwarded is not None and not outcome.fleet_errors:
        said = f" after the signal {outcome.forwarded} forwarded as the checkpoint signal"
    if outcome.first_ended is not None:
        return f"fleet: {outcome.first_ended.describe()} ended first and the job stopped: {how}{said}"
    return f"fleet: the job stopped abnormally: {how}{said}"


def _append_error_log(run_dir: Path, line: str) -> None:
    if not run_dir.is_dir():
        return
    try:
        with open(run_dir / "fleet-errors.log", "a", encoding="utf-8") as log:
            log.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {line}\n")
    except OSError:
        pass


def _write_partial_results(spec: Spec, run_dir: Path) -> None:
    try:
        results_from_log(spec, run_dir)
    except (OSError, ValueError) as exc:
        print(f"fleet: could not write results.json from the event log: {exc}", file=sys.stderr)
        return
    print(f"fleet: wrote {run_dir / 'results.json'} from the event log (interrupted)", file=sys.stderr)
