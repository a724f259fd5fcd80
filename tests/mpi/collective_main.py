"""Entry point of the collective MPI tests: ``mpiexec -n N python collective_main.py SUITE DIR``.

Every rank writes its record (``{"rank": r, ...}``) to DIR/rank-R.json; tests/test_collectives.py
asserts on all of them. Files, not stdout: Open MPI's output forwarding cuts lines longer than
a few KB and interleaves the pieces of different ranks. Suites: ``checks`` (sums, broadcasts, equivalence, churn), ``checks-busy`` (the same, polling busily), ``nospin`` (CPU time
of a rank waiting for a late one), ``timeout`` (a rank that never joins). The last two end
every rank with `os._exit`, since operations are left pending on purpose.
"""

from __future__ import annotations

import faulthandler
import json
import os
import sys
import time

import numpy as np
from mpi4py import MPI

import collective_cases as cases
from fleet.atomic import atomic_write_text
from fleet.runtime.waiting import WaitTimeout, recv_object, use_busy_polling, wait_requests

LATE_S = 2.0
STACKS_AFTER_S = 100.0  # a stuck rank prints every thread's stack and exits before the test's timeout


def nospin(world) -> dict:
    """Rank 1 joins each backend's allreduce LATE_S late; rank 0 reports its CPU share meanwhile."""
    out = {}
    for name in cases.BACKEND_NAMES:
        with cases.make_collective(name, world) as coll:
            buf = np.ones(1000, np.float32)
            coll.allreduce_sum(buf)  # connected and warm
            cases.world_barrier(world)
            if coll.rank == 1:
                time.sleep(LATE_S)
            wall, cpu = time.perf_counter(), time.process_time()
            coll.allreduce_sum(buf)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            sum_ok = bool(np.all(buf == coll.size**2))
            out[name] = {"wall_s": wall, "cpu_s": cpu, "cpu_share": cpu / wall, "sum_ok": sum_ok}
    return out


def timeout(world) -> dict:
    """Rank 0 calls allreduce_sum with a 1 s timeout; the others never join (and are told when to stop)."""
    out = {}
    for name in cases.BACKEND_NAMES:
        cases.world_barrier(world)
        coll = cases.make_collective(name, world, label="group 'lonely'")
        coll.timeout_s = 1.0  # built with the usual timeout: a loaded machine may take seconds to build it
        if world.rank == 0:
            start = time.perf_counter()
            try:
                coll.allreduce_sum(np.ones(8))
                out[name] = {"raised": None}
            except WaitTimeout as exc:
                out[name] = {"raised": "WaitTimeout", "message": str(exc), "after_s": time.perf_counter() - start}
            except Exception as exc:  # reported, so the test shows what came instead
                out[name] = {"raised": type(exc).__name__, "message": str(exc)}
        if world.rank == 0:
            sends = [world.isend(name, dest=dest, tag=7) for dest in range(1, world.size)]
            wait_requests(sends, "the release of the other ranks", 60.0)
        else:
            out[name] = {"released_by": recv_object(world, 0, 7, "rank 0's release", 60.0)}
    return out


def everyone_wrote(world) -> None:
    """Return once every rank has written: the launcher kills the others when the first rank exits
    without MPI_Finalize, which could otherwise stop a slower rank before its record."""
    if world.rank == 0:
        for source in range(1, world.size):
            recv_object(world, source, 8, f"rank {source}'s record", 60.0)
    else:
        wait_requests([world.issend("written", dest=0, tag=8)], "rank 0 to hear the record was written", 60.0)


def busy_checks(world) -> dict:
    """`checks` in a process that polls busily (as the runtime chooses where ranks have cores)."""
    use_busy_polling(True)
    return cases.all_checks(world)


SUITES = {"checks": cases.all_checks, "checks-busy": busy_checks, "nospin": nospin, "timeout": timeout}


def main() -> None:
    faulthandler.dump_traceback_later(STACKS_AFTER_S, exit=True)
    world = MPI.COMM_WORLD
    suite, directory = sys.argv[1:3]
    result = {"rank": world.rank, "size": world.size, "suite": suite, **SUITES[suite](world)}
    atomic_write_text(os.path.join(directory, f"rank-{world.rank}.json"), json.dumps(result))
    if not suite.startswith("checks"):
        sys.stderr.flush()
        everyone_wrote(world)
        os._exit(0)  # pending operations on purpose: skip MPI_Finalize


if __name__ == "__main__":
    main()
