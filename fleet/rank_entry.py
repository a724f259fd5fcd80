"""`fleet train` and `fleet profile`: the per-rank entry point under mpiexec, srun or jsrun.

It sits above the runtime and the profiler and runs them in order: every rank starts
(`fleet.runtime.rank.start`: spec, topology, its role for the whole job), takes part in
profiling where rank 0 decided the rates must be measured first (`profiler.job`), learns the
run's set-up (`set_up`) and runs its role's loop (`run_role`); rank 0 then summarizes the job
(`fleet.runtime.finish`). Any error ends the whole job with one line naming the rank.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from fleet.atomic import atomic_write_json
from fleet.errors import UserError
from fleet.runtime.finish import summarize_job
from fleet.runtime.launch.process import exit_all, finalize_mpi, init_mpi, one_blas_thread
from fleet.runtime.launch.signals import ignore_checkpoint_signals, install_checkpoint_signals
from fleet.runtime.control.rates_source import STEPS_FILE
from fleet.runtime.launch.topology import LaunchMismatch, TopologyError
from fleet.runtime.rank import SameOnEveryRank, TrainOptions, run_role, set_up, start
from fleet.runtime.waiting import RankIdentity, abort_job, barrier
from fleet.spec import SpecError
from profiler.job import run_profiling, run_timed_steps

LINE_GRACE_S = 2.0
"""How long ranks that print nothing wait before leaving, where MPI cannot end the job together."""


def train_entry(options: TrainOptions) -> int:
    """This rank's part in the whole job; its exit code (the job's, where every rank ends alike)."""
    import warnings

    # mpi4py's three-line warning about another MPI's launcher, given once MPI_Init has
    # returned a world of one: `check_launch` then says it in one line
    warnings.filterwarnings("ignore", message="suspicious MPI execution environment")
    one_blas_thread()

    try:
        MPI = init_mpi()
    except LaunchMismatch as exc:  # before MPI_Init: no collective exit, each rank leaves on its own
        if exc.prints:
            sys.stderr.write(f"fleet train: error: {exc}\n")
        else:  # the launcher ends the job at the first rank's exit: let the line out first
            time.sleep(LINE_GRACE_S)
        raise SystemExit(UserError.exit_code) from None
    world = MPI.COMM_WORLD
    who = RankIdentity(world.rank)
    process_start = time.monotonic()
    checkpoint_signal = install_checkpoint_signals()
    try:
        ctx = _start_or_exit(world, who, options)
        ctx.process_start = process_start
        ctx.checkpoint_signal = checkpoint_signal
        if not options.profile_only:
            run_role(ctx, options)
        if options.epilogue is not None and ctx.rank == 0:
            options.epilogue(ctx.spec, Path(ctx.run_dir))
        barrier(world, "every rank to finish", ctx.timeout_s)
        ignore_checkpoint_signals()
        if ctx.pool is not None:
            ctx.pool.free()
        if ctx.run_lock is not None:
            ctx.run_lock.release()
        finalize_mpi()  # now, not in the interpreter's exit: MPI_Finalize waits for every rank's
        if ctx.rank == 0 and not options.profile_only:  # while the other ranks exit
            summarize_job(ctx.spec, Path(ctx.run_dir), ctx.exit_code)
    except SystemExit as exc:
        if MPI.Is_finalized():  # exit_all: every rank leaves together
            raise
        # anything else (code run on fleet's behalf calling sys.exit) would leave the others waiting
        abort_job(world, who, f"sys.exit({'' if exc.code is None else repr(exc.code)}) was called during the job",
                  code=3)
    except UserError as exc:
        abort_job(world, who, str(exc), code=UserError.exit_code)
    except BaseException as exc:  # any other failure ends the whole job, never a hang
        detail = "".join(traceback.format_exception_only(type(exc), exc)).strip().replace("\n", " ")
        if os.environ.get("FLEET_DEBUG"):
            traceback.print_exc()
        abort_job(world, who, detail, code=3)
    return ctx.exit_code


def _start_or_exit(world: Any, who: RankIdentity, options: TrainOptions):
    """`_start`; an error every rank meets alike (spec, topology, run directory) ends the job
    cleanly: rank 0 prints one line and every rank exits 2."""
    started: dict = {}
    try:
        return _start(world, who, options, started)
    except (SpecError, TopologyError, SameOnEveryRank) as exc:
        if "ctx" in started and started["ctx"].run_lock is not None:  # rank 0 had taken it
            started["ctx"].run_lock.release()
        exit_all(world, UserError.exit_code, f"fleet train: error: {exc}")
    except LaunchMismatch as exc:
        exit_all(world, UserError.exit_code, f"fleet train: error: {exc}" if exc.prints else None)


def _start(world: Any, who: RankIdentity, options: TrainOptions, started: dict):
    """Start-up; profiling where the rates are to be measured first; the run's set-up unless
    only profiling (`started` gets the context as soon as there is one)."""
    ctx, rates = start(world, who, options, started)
    if rates["measure"]:
        _profile(ctx, options)
    elif rates["time_steps"]:
        _time_steps(ctx, options, list(rates["time_steps"]), list(rates["time_groups"]))
    if not options.profile_only:
        set_up(ctx, rates)
    return ctx


def _say(options: TrainOptions):
    """Where the profiler's progress lines go: stdout, or nowhere with ``--quiet``."""
    return (lambda line: None) if options.quiet else (lambda line: print(line, flush=True))


def _time_steps(ctx, options: TrainOptions, models: list[str], groups: list[str]) -> None:
    """Every rank takes part; rank 0 writes steps.json (`fleet.profiling.timed_steps`)."""
    document = run_timed_steps(ctx, models, groups, _say(options))
    if ctx.rank != 0:
        return
    path = Path(ctx.run_dir) / STEPS_FILE
    atomic_write_json(path, document)
    print(f"fleet: timed the steps of {len(document['rates'])} model(s) in {document['seconds']:.1f} s "
          f"to correct the rates estimated from FLOPs; wrote {path}", flush=True)


def _profile(ctx, options: TrainOptions) -> None:
    """Every rank takes part; rank 0 writes profile.json (and, for a dry run, the report)."""
    document = run_profiling(ctx, _say(options))
    if ctx.rank != 0:
        return
    path = Path(ctx.run_dir) / "profile.json"
    atomic_write_json(path, document)
    print(f"fleet: profiled {len(document['models'])} model(s) in {document['profiler']['seconds']:.1f} s; "
          f"wrote {path}", flush=True)
    for failure in document["failures"]:
        print(f"fleet: warning: {failure['id']} on {failure['gpus']} GPU(s) failed to profile: {failure['reason']}; "
              "it is left out of the plan", flush=True)
