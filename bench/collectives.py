"""Allreduce throughput of fleet's collective backends beside a raw MPI_Allreduce, in one run.

For each group size (`--groups`, default 2 and 4 ranks) one `mpiexec` runs, on every rank,
for each gradient size (`--sizes`, default 1, 16 and 64 MB of float32):

- ``raw MPI_Allreduce``: mpi4py's blocking ``Allreduce(IN_PLACE)`` on a duplicate of
  COMM_WORLD, what a hand-written data-parallel loop calls;
- each fleet backend this process can use (``mpi``, ``torch-gloo``, ``horovod``), through the
  collective interface the trainers use (`allreduce_sum` on the same host array).

The backends are interleaved repetition by repetition (raw, mpi, torch, horovod, raw, ...), so
drift on a shared machine hits all alike; each figure is the median of `--repeats` timed calls
after `--warmup` untimed ones, as algorithm bandwidth (bytes of the array / seconds). A call
is timed on every rank from a barrier to its return, and the slowest rank counts.

Waits poll as fleet's runtime polls (`--poll`, like `runtime.poll`): ``auto`` polls without
sleeping where every rank (and Horovod's background thread) has a core, else with short sleeps.

Usage: .venv/bin/python bench/collectives.py [--groups 2 4] [--sizes 1 16 64] [--repeats 15] [--poll auto]
Prints a table per group size with each backend's ratio to the raw allreduce (target for
Horovod: >= 0.9x). Oversubscribed (more ranks than cores) the figures vary 1.5-2x between
runs with how the OS schedules the ranks: run nothing else meanwhile.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _harness import run_to_end

MB = 1 << 20


def backends(comm) -> dict:
    """Each usable backend's collective over `comm` (name -> collective), raw first."""
    # in the ranks only, after MPI_Init: the launching process needs neither torch nor Horovod
    from fleet.runtime.train.collectives.horovod import HorovodCollective
    from fleet.runtime.train.collectives.mpi import MPICollective
    from fleet.runtime.train.collectives.torch_dist import TorchCollective

    made = {"raw MPI_Allreduce": None, "mpi": MPICollective(comm, 300.0, "group 'bench'"),
            "torch-gloo": TorchCollective(comm, "cpu", 300.0, "group 'bench'")}
    if HorovodCollective.unavailable("cpu") is None:
        made["horovod"] = HorovodCollective(comm, "cpu", 300.0, "group 'bench'")
    else:
        print(f"collectives: no horovod: {HorovodCollective.unavailable('cpu')}", file=sys.stderr)
    return made


def timed_call(comm, coll, buf, raw_comm) -> float:
    """Seconds of one allreduce, barrier to return, on the slowest rank."""
    from mpi4py import MPI

    raw_comm.Barrier()
    start = time.perf_counter()
    if coll is None:
        raw_comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
    else:
        coll.allreduce_sum(buf)
    seconds = time.perf_counter() - start
    return raw_comm.allreduce(seconds, op=MPI.MAX)


def worker(sizes_mb: list[float], repeats: int, warmup: int, poll_mode: str, out: str) -> None:
    """Under mpiexec: every backend, every size; rank 0 writes the medians to `out`."""
    import numpy as np
    import torch
    from mpi4py import MPI

    from fleet.runtime.waiting import busy_polling_fits, use_busy_polling  # in the ranks only, as in `backends`

    torch.set_num_threads(1)
    world = MPI.COMM_WORLD
    busy = busy_polling_fits(2 * world.size) if poll_mode == "auto" else poll_mode == "busy"
    use_busy_polling(busy)  # before Horovod starts: its waits read the choice
    raw_comm = world.Dup()
    made = backends(world)
    result = {"ranks": world.size, "sizes_mb": sizes_mb, "poll": "busy" if busy else "sleep", "gbps": {}}
    for size_mb in sizes_mb:
        buf = np.ones(int(size_mb * MB) // 4, np.float32)
        times: dict[str, list[float]] = {name: [] for name in made}
        for rep in range(warmup + repeats):
            for name, coll in made.items():
                buf.fill(1.0)
                seconds = timed_call(world, coll, buf, raw_comm)
                assert buf[0] == world.size and buf[-1] == world.size, (name, buf[0])
                if rep >= warmup:
                    times[name].append(seconds)
        for name, values in times.items():
            result["gbps"].setdefault(name, {})[str(size_mb)] = buf.nbytes / statistics.median(values) / 1e9
    for coll in made.values():
        if coll is not None:
            coll.close()
    raw_comm.Free()
    if world.rank == 0:
        Path(out).write_text(json.dumps(result))


def run_group(ranks: int, args: argparse.Namespace) -> dict:
    from fleet.runtime.launch.mpiexec import find_mpiexec  # fleet is imported in the ranks only, as in `backends`

    with tempfile.TemporaryDirectory(prefix="fleet-bench-coll-") as tmp:
        out = os.path.join(tmp, "result.json")
        command = [find_mpiexec(), "-n", str(ranks), sys.executable, __file__, "--worker", out,
                   "--sizes", *map(str, args.sizes), "--repeats", str(args.repeats), "--warmup", str(args.warmup),
                   "--poll", args.poll]
        run_to_end(command, f"collectives: mpiexec -n {ranks}", args.timeout, capture=False)  # the ranks' notes show
        return json.loads(Path(out).read_text())


def print_table(result: dict) -> None:
    raw = result["gbps"]["raw MPI_Allreduce"]
    print(f"\n{result['ranks']} ranks, {result['poll']} polling: allreduce of float32 arrays, algorithm bandwidth GB/s (x raw MPI_Allreduce)")
    print(f"{'backend':<20}" + "".join(f"{size + ' MB':>22}" for size in raw))
    for name, figures in result["gbps"].items():
        cells = "".join(f"{gbps:>12.3f} ({gbps / raw[size]:>5.2f}x)" for size, gbps in figures.items())
        print(f"{name:<20}{cells}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, nargs="+", default=[2, 4], help="group sizes (ranks)")
    parser.add_argument("--sizes", type=float, nargs="+", default=[1, 16, 64], help="array sizes in MB")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--poll", choices=["auto", "busy", "sleep"], default="auto", help="how waits poll (as runtime.poll)")
    parser.add_argument("--json", help="also write every figure to this file")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.sizes, args.repeats, args.warmup, args.poll, args.worker)
        return
    print(f"collectives: {os.cpu_count()} cores; {args.repeats} timed calls per figure (median), backends interleaved")
    results = [run_group(ranks, args) for ranks in args.groups]
    for result in results:
        print_table(result)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
