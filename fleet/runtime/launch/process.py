"""Ending every rank of an MPI job the same way, with one line and no launcher noise.

When every rank reaches the same conclusion (a `UserError` that all ranks compute alike,
such as a `TopologyError`), the job should end like the single-process CLI: one line on
stderr and exit status 2. `exit_all` does that; it is collective over `world`. A failure
seen by one rank only goes through `fleet.runtime.waiting.abort_job` instead.

What Hydra does (MPICH 5.0.2 ``mpiexec`` from the PyPI ``mpich`` wheel, 4 and 6 ranks on one
host, checked by hand and by ``tests/test_topology_mpi.py``):

- Every rank leaving through the normal interpreter exit (``SystemExit(2)``, with or without
  ``MPI.Finalize()`` first): ``mpiexec`` exits 2 and prints nothing, even with ranks leaving
  up to a second apart in any order. Its status is the highest of the ranks' (ranks exiting
  2 and 0: 2; 2 and 3: 3).
- ``os._exit(code)``, before or after ``MPI.Finalize()``: it skips the C exit handlers
  through which MPICH ends its PMI connection, so Hydra's proxy takes the closed PMI socket
  for a crash and SIGKILLs every other rank still running. ``mpiexec`` then prints its
  "BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES ... EXIT CODE: 9" banner and exits
  9, unless all ranks happen to exit at the same instant (a race, not a fix).
- ``MPI_Abort(comm, n)``: each calling rank prints ``Abort(n) on node r (rank r in comm 0):
  application called MPI_Abort(...)``, the others are killed, and ``mpiexec`` exits n.

Hence: the root prints the line, every rank flushes, finalizes MPI and raises
``SystemExit(code)``; never ``os._exit`` on a path that should end quietly.

Lines: with PYTHONUNBUFFERED set, ``print(text)`` makes two writes (the text, then the
newline), and mpiexec forwards other ranks' output in between, so two ranks' lines can come
out glued together. Write a whole line in one ``write`` call.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any, NoReturn

from threadpoolctl import ThreadpoolController

from fleet.runtime.launch.jobenv import read_job_env
from fleet.runtime.launch.topology import check_library


def exit_all(world: Any, code: int, message: str | None = None, root: int = 0) -> NoReturn:
    """End this rank with `code`, as every rank of `world` does; `root` prints `message`.

    Collective: every rank of `world` must call it (MPI is finalized). The exit is a
    ``SystemExit``, so ``finally`` blocks run, and they must not use MPI any more.
    """
    if message is not None and world.Get_rank() == root:
        sys.stderr.write(message + "\n")  # one write: print() may split off the newline
    sys.stdout.flush()
    sys.stderr.flush()
    finalize_mpi()
    raise SystemExit(code)


def one_blas_thread() -> None:
    """Limit the BLAS libraries loaded so far (numpy's) to one thread in this rank's process.

    A preprocessor decodes on one core (the predictions count it so), yet numpy's OpenBLAS
    starts a thread per core for the matrix products of resizing, and its threads spin while
    they wait for work: on a CPU node whose ranks want more than its cores, a preprocessor took
    1.7x the CPU its decoding loop used (the rest spinning), from the trainers beside it.
    Torch is not loaded yet here: a trainer's own threads are set by its engine
    (``threads_per_trainer``)."""
    ThreadpoolController().limit(limits=1, user_api="blas")


def init_mpi(environ: Mapping[str, str] = os.environ) -> Any:
    """Import mpi4py's ``MPI`` and initialize MPI (thread level "multiple"), once
    `check_library` has found that ``MPI_Init`` can work under this launcher.

    mpi4py would call ``MPI_Init`` on import (``mpi4py.rc.initialize``), before any check
    could run, so the import is told not to, and mpi4py still finalizes at exit.

    Raises:
        LaunchMismatch: ``MPI_Init`` would abort (MPI is left uninitialized).
    """
    import mpi4py

    if "mpi4py.MPI" not in sys.modules:
        mpi4py.rc.initialize = False
        mpi4py.rc.finalize = True
    from mpi4py import MPI

    if not MPI.Is_initialized():

        check_library(read_job_env(environ), MPI.Get_library_version())
        MPI.Init_thread(MPI.THREAD_MULTIPLE)
    return MPI


def mpi_library() -> str:
    """The MPI that mpi4py was built with, e.g. ``Open MPI 4.1.4``."""
    from mpi4py import MPI

    name, version = MPI.get_vendor()
    return f"{name} {'.'.join(map(str, version))}"


def finalize_mpi() -> None:
    """Finalize MPI if this process initialized it and has not finalized it yet."""
    if "mpi4py.MPI" not in sys.modules:
        return
    from mpi4py import MPI

    if MPI.Is_initialized() and not MPI.Is_finalized():
        MPI.Finalize()
