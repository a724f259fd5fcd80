"""The checkpoint signal: USR1 (Slurm's ``--signal=B:USR1@120``, LSF's ``-wa USR1``) or TERM
(what a batch system sends at the walltime limit).

Every rank of `fleet train` catches both, so that a signal delivered to the whole job step
does not kill ranks in the middle of a checkpoint. Only rank 0 acts on it: the coordinator
checkpoints every running model at its next step, shuts the job down and every rank exits
with `EXIT_CHECKPOINTED`, which tells a batch script to requeue the job (a job started again
in the same run directory resumes).
"""

from __future__ import annotations

import signal
import threading

EXIT_CHECKPOINTED = 75  # EX_TEMPFAIL: checkpointed, not finished; run again in the same run directory
CHECKPOINT_SIGNALS = (signal.SIGUSR1, signal.SIGTERM)


def install_checkpoint_signals() -> threading.Event:
    """Catch the checkpoint signals in this process (main thread only); the event is set
    when one arrives."""
    received = threading.Event()

    def on_signal(signum, frame) -> None:
        received.set()

    if threading.current_thread() is threading.main_thread():
        for signum in CHECKPOINT_SIGNALS:
            signal.signal(signum, on_signal)
    return received


def ignore_checkpoint_signals() -> None:
    """After the job's work: a checkpoint signal has nothing left to checkpoint. Ignored (the
    interpreter keeps an ignored signal ignored while it exits; a handled one it resets to the
    default, which would kill a rank that is only exiting, and fail a job that succeeded)."""
    if threading.current_thread() is threading.main_thread():
        for signum in CHECKPOINT_SIGNALS:
            signal.signal(signum, signal.SIG_IGN)
