"""One rank of a training job, in the runtime: its start-up, the run's set-up, its role's loop.

Every rank reads the spec, takes part in one topology step that gives it its role for the
whole job (`start`), learns the run's set-up from rank 0 once the rates are known (`set_up`)
and runs that role's loop (`run_role`): rank 0 is a preprocessor and also runs the
coordinator in a thread. The per-rank entry point, `fleet.rank_entry`, runs these in order,
with profiling between start-up and set-up where the rates must be measured first.
"""

from __future__ import annotations

import importlib
import os
import socket
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from fleet.atomic import atomic_write_json
from fleet.engines import get_framework
from fleet.errors import UserError
from fleet.host import node_cores
from fleet.inspect import describe_ensemble, ensemble_counts, remember
from fleet.runlock import RunLock
from fleet.runtime.context import RunContext
from fleet.runtime.control.console import Console
from fleet.runtime.control.coordinator import Coordinator
from fleet.runtime.control.fusing import BundleWays
from fleet.runtime.control.host_use import RANK0_ROLE, HostUse
from fleet.runtime.control.setup import (check_partitions, epoch_limits, plan_run, policy_for,
                                         prepare_run_dir, rates_decision, switch_candidates, write_run)
from fleet.runtime.data.chunks import ChunkLayout
from fleet.runtime.data.preprocessor import PreprocessorLoop
from fleet.runtime.data.shm import create_pool
from fleet.runtime.data.transport import FANOUT_WINDOW
from fleet.runtime.events import EventLog
from fleet.runtime.launch.jobenv import read_job_env
from fleet.runtime.launch.process import exit_all, mpi_library
from fleet.runtime.launch.signals import EXIT_CHECKPOINTED
from fleet.runtime.launch.supervise import RANKS_FILE
from fleet.runtime.launch.topology import (
    Role,
    bind_device,
    build_topology,
    check_launch,
    gather_node_names,
)
from fleet.runtime.protocol import Tag
from fleet.runtime.train.collectives.factory import resolve_backend
from fleet.runtime.train.trainer import TrainerLoop
from fleet.runtime.waiting import (RankIdentity, abort_job, barrier, bcast_object, busy_polling_fits, polling_threads,
                                   recv_object, send_object, use_busy_polling, wait_requests)
from fleet.schedule.choice import reconsider
from fleet.spec import Device
from fleet.spec.asked import asked_path, read_asked, with_asked
from preprocess.grouped import load_run_spec
from preprocess.readers import class_notices


@dataclass(frozen=True)
class TrainOptions:
    spec_path: str
    run_dir: str | None = None
    ranks_per_node: int | None = None
    device: str | None = None
    quiet: bool = False
    profile_only: bool = False  # `fleet profile`: measure, train nothing
    calibrate_from: str | None = None  # a run directory whose measured costs the predictions take
    epilogue: Callable[[Any, Path], None] | None = None  # rank 0, (spec, run dir), before the job ends


class SameOnEveryRank(UserError):
    """A user error that rank 0 found and broadcast, so every rank raises it."""


def start(world: Any, who: RankIdentity, options: TrainOptions, started: dict) -> tuple[RunContext, dict]:
    """Collective: spec, topology and communicators; rank 0 prepares the run directory and
    decides whether to profile first (`started` gets the context as soon as there is one).

    Returns:
        The rank's context and rank 0's rates decision: ``measure`` (profile before training),
        ``emulated`` (the rates an emulated device's steps take) and ``setup`` (the run's
        set-up, already made where nothing is measured first; else None).

    Raises:
        SpecError, TopologyError, LaunchMismatch, SameOnEveryRank: what every rank meets alike.
    """
    spec = load_run_spec(options.spec_path, run_dir=options.run_dir, say=_said if world.rank == 0 else None)
    spec = with_asked(spec, read_asked(spec.run_dir), str(asked_path(spec.run_dir)))  # a search's models so far
    partitions = check_partitions(spec)
    if options.device:
        spec = with_device(spec, options.device)
    env = read_job_env(os.environ)
    check_launch(world.Get_size(), env, mpi_library())
    topology = build_topology(world, spec.cluster, env, options.ranks_per_node)
    placement = topology.placements[world.rank]
    who.role, who.node = placement.role.value, placement.node
    processes = gather_node_names(world, f"{socket.gethostname()} {os.getpid()}", spec.runtime.timeout_s)

    who.error_log = str(Path(spec.run_dir) / "fleet-errors.log")
    _choose_polling(spec, topology, placement.node)
    ctrl, data_parent, group_parent = world.Dup(), world.Dup(), world.Dup()
    device = "emulated" if spec.cluster.device.value == "emulated" else bind_device(
        placement, spec.cluster, env, _visible_gpus(spec)
    )
    ctx = started["ctx"] = RunContext(spec, world, ctrl, data_parent, group_parent, topology, who, device, spec.run_dir)
    ctx.partitions = partitions  # read once, from the manifest
    ctx.profile_only = options.profile_only
    ctx.calibrate_from = options.calibrate_from
    ctx.processes = processes
    _agree_on_collective(world, spec, len(topology.trainer_ranks()), _warm_up(ctx, placement.role.value))
    rates = _from_rank0(ctx, _rank0_rates, "the rates decision from rank 0")
    ctx.rates = rates["emulated"]
    if not options.profile_only:
        ctx.pool = _chunk_pool(ctx)
    if ctx.rank == 0:
        _say_data_notices(ctx)
    barrier(world, "every rank to finish starting up", spec.runtime.timeout_s)
    return ctx, rates


def set_up(ctx: RunContext, rates: dict) -> None:
    """Collective, once the rates are known (measured or not): the run's set-up from rank 0
    (`start`'s, or made now) and what every rank takes from it.

    Raises:
        SameOnEveryRank: rank 0 could not set the run up.
    """
    shared = rates["setup"] or _from_rank0(ctx, _rank0_setup, "the run's set-up from rank 0")
    ctx.rates = rates["emulated"] or shared["rates"]
    ctx.epoch_limits = shared["epoch_limits"]
    ctx.own_decoding = shared["own_decoding"]
    if shared["own_decoding"]:  # each trainer also runs a decoder thread: one more poller
        _choose_polling(ctx.spec, ctx.topology, ctx.topology.placements[ctx.rank].node, own_decoding=True)


def _agree_on_collective(world: Any, spec, trainers: int, why: str | None) -> None:
    """Every rank learns whether each of the `trainers` can use the spec's collective (`why`
    not: the reason); if one cannot, every rank exits 2 and the first such rank says why, in
    one line, naming its rank where other trainers could use it."""
    if spec.cluster.gpus < 2:
        return
    from mpi4py import MPI  # initialized by now

    first, failed = np.array([world.rank if why else world.size]), np.array([1 if why else 0])
    wait_requests([world.Iallreduce(MPI.IN_PLACE, first, op=MPI.MIN),
                   world.Iallreduce(MPI.IN_PLACE, failed, op=MPI.SUM)],
                  "every rank's check of the collective", spec.runtime.timeout_s)
    if first[0] < world.size:
        where = "" if failed[0] == trainers else f"rank {first[0]}: "
        exit_all(world, UserError.exit_code, f"fleet train: error: {where}{why}", root=int(first[0]))


def with_device(spec, device: str):
    """The spec with `cluster.device` overridden (``--device``), as the validated enum."""
    return spec.model_copy(update={"cluster": spec.cluster.model_copy(update={"device": Device(device)})})


def _chunk_pool(ctx):
    """Collective: this node's shared-memory chunk pool (`runtime.shared_memory`), or None."""
    if not ctx.spec.runtime.shared_memory:
        return None

    slot_bytes = ChunkLayout(ctx.chunk_samples, ctx.input_shape).nbytes
    return create_pool(ctx.world, ctx.topology, 2 * ctx.qp_chunks + FANOUT_WINDOW, slot_bytes, ctx.timeout_s)


def _from_rank0(ctx, make, what: str) -> Any:
    """What rank 0's `make(ctx)` returns, on every rank; a user error there (a str) ends every rank."""
    shared = bcast_object(ctx.world, make(ctx) if ctx.rank == 0 else None, 0, what, ctx.timeout_s)
    if isinstance(shared, str):
        raise SameOnEveryRank(shared)
    return shared


def _rank0_rates(ctx) -> dict | str:
    """Whether to profile first, and the rates an emulated device's steps take."""
    try:
        _lock_run_dir(ctx)
        run_dir = prepare_run_dir(ctx.spec)
        _write_ranks(ctx, run_dir)
        decision = rates_decision(ctx.spec, run_dir, ctx.profile_only, ctx.epoch_samples)
    except UserError as exc:
        return str(exc)
    if decision.note:
        print(f"fleet: {decision.note}", flush=True)
    setup = None
    if not decision.measure and not decision.time_steps and not ctx.profile_only:  # the plan now, in the same message
        ctx.rates = decision.emulated_rates
        setup = _rank0_setup(ctx)
        if isinstance(setup, str):
            return setup
    return {"measure": decision.measure, "emulated": decision.emulated_rates, "setup": setup,
            "time_steps": decision.time_steps, "time_groups": decision.time_groups}


def _lock_run_dir(ctx) -> None:
    """Rank 0 holds the run directory's lock for the whole job (`fleet.runlock`)."""
    command = "fleet profile" if ctx.profile_only else "fleet train"
    lock = RunLock(ctx.spec.run_dir, command, job=read_job_env(os.environ).job_id)

    def lost(message: str) -> None:
        abort_job(ctx.world, ctx.who, message, code=UserError.exit_code)

    lock.acquire(on_lost=lost)
    ctx.run_lock = lock
    if lock.note:
        print(f"fleet: note: {lock.note}", flush=True)


def _write_ranks(ctx, run_dir: Path) -> None:
    """ranks.json: every rank's host, pid, role and node (`fleet run` watches these pids)."""
    ranks = []
    for placement, process in zip(ctx.topology.placements, ctx.processes):
        host, _, pid = process.rpartition(" ")
        ranks.append({"rank": placement.rank, "host": host, "pid": int(pid), "role": placement.role.value,
                      "node": placement.node, "gpu": placement.gpu})
    atomic_write_json(run_dir / RANKS_FILE, {"ranks": ranks})


def host_use_of(ctx, plan) -> HostUse | None:
    """Rank 0's sampler of the ranks' CPU (`fleet.runtime.control.host_use`), on a CPU job
    whose ranks all run on its host; None elsewhere."""
    cores = plan.basis.cores
    hosts = {process.rpartition(" ")[0] for process in ctx.processes}
    if cores is None or len(hosts) != 1:
        return None
    pids = [int(process.rpartition(" ")[2]) for process in ctx.processes]
    roles = [RANK0_ROLE if placement.rank == 0 else placement.role.value for placement in ctx.topology.placements]
    cluster, ledger = ctx.spec.cluster, plan.ledger
    preprocessors = len(ctx.topology.preprocessor_ranks())
    return HostUse(pids, cores.cores,
                   lambda: (cluster.gpus - len(ledger.free_gpus)) * cores.trainer_cores + preprocessors, roles=roles)


def _said(line: str) -> None:
    """A line of rank 0's to the job's console."""
    print(f"fleet: {line}", flush=True)


def _say_data_notices(ctx) -> None:
    """Rank 0 (once for the job): what the data set's reader says of its classes."""
    for notice in class_notices(ctx.reader):
        print(f"fleet: {notice}", flush=True)


def _warm_up(ctx, role: str) -> str | None:
    """The one-time work of each rank before the clock starts, done side by side: every rank
    opens the data set; a trainer checks that it can use the spec's collective where groups of
    several trainers can form (the reason it cannot, returned, ends the job: e.g. ``horovod``
    not built), imports its framework and decodes the validation set (a master evaluates on it
    after every epoch). The first trainer also counts the models' costs that rank 0's plan
    needs and sends them with the collective's name (`_hand_to_rank0`), so that a preprocessor
    rank 0 never imports a framework (1-2 s of a core at start-up and exit)."""
    _ = ctx.train_idx, ctx.pipeline
    why = None
    if role == "trainer":
        try:
            ctx.collective = resolve_backend(ctx.spec.runtime.collective, ctx.spec.cluster.device.value)
        except UserError as exc:
            why = str(exc) if ctx.spec.cluster.gpus > 1 else None
    _hand_to_rank0(ctx)
    if role != "trainer" or why:
        return why
    _ = ctx.validation
    for module in ("fleet.engines.factory", "fleet.runtime.train.trainer"):
        importlib.import_module(module)
    if ctx.device != "emulated":
        for name in sorted({m.framework for m in ctx.spec.models}):
            get_framework(name)  # importing the framework is the slow part
    return None


def _hand_to_rank0(ctx) -> None:
    """The first trainer sends rank 0 the collective's name and, where rank 0 will plan with
    rates estimated from FLOPs, the models' counts (`ensemble_counts`; None where counting
    fails: rank 0 then counts itself and says why in one line)."""
    first = min(ctx.topology.trainer_ranks())
    if ctx.rank not in (0, first) or first == 0:
        if ctx.rank == 0:  # rank 0 trains too: it has the framework anyway
            _count_model_costs(ctx.spec, Path(ctx.run_dir))
        return
    what = "the first trainer's start-up counts for rank 0"
    if ctx.rank == first:
        counts = None
        if _needs_model_costs(ctx.spec, Path(ctx.run_dir)):
            try:
                counts = ensemble_counts(ctx.spec)
            except UserError:
                pass
        message = {"collective": ctx.collective, "counts": counts}
        send_object(ctx.ctrl, message, 0, Tag.STARTUP, what, ctx.timeout_s)
        return
    message = recv_object(ctx.ctrl, first, Tag.STARTUP, what, ctx.timeout_s)
    if message["collective"]:
        ctx.collective = message["collective"]
    if message["counts"]:
        remember(message["counts"])


def _needs_model_costs(spec, run_dir: Path) -> bool:
    """Rank 0 plans with rates estimated from the models' FLOPs: no rates to reuse."""
    return spec.cluster.device.value != "emulated" and not (run_dir / "profile.json").exists()


def _count_model_costs(spec, run_dir: Path) -> None:
    """Rank 0, while the others warm up: the models' sizes and FLOPs that rates estimated
    without a profile need (`describe_ensemble` keeps them); a problem is said later, where
    the plan needs them."""
    if not _needs_model_costs(spec, run_dir):
        return
    try:
        describe_ensemble(spec)
    except UserError:
        pass


def _choose_polling(spec, topology, node: int, own_decoding: bool = False) -> None:
    """Busy polling where the node has a core for each polling thread (`polling_threads`),
    sleeping polls where ranks share cores."""
    mode = spec.runtime.poll
    if mode == "auto":
        threads = polling_threads(len(topology.trainer_ranks(node)), len(topology.preprocessor_ranks(node)),
                                  own_decoding)
        use_busy_polling(busy_polling_fits(threads))
    else:
        use_busy_polling(mode == "busy")


def _visible_gpus(spec) -> int | None:
    """GPUs this process sees on a CUDA cluster, as the first model's framework counts them
    (every framework sees the same devices)."""
    if spec.cluster.device.value != "cuda":
        return None
    return get_framework(spec.models[0].framework).visible_gpus()


def job_cores_per_node(ctx) -> float:
    """The cores of the machine a node of the job runs on (rank 0's); virtual nodes on one
    machine share them (`SharedCores.nodes_per_host`)."""
    return float(node_cores())


def _rank0_setup(ctx) -> dict | str:
    """The plan on rank 0; a user error becomes its message for every rank."""
    try:
        plan = plan_run(ctx.spec, Path(ctx.run_dir), ctx.epoch_samples, ctx.partitions, ctx.calibrate_from,
                        job_cores_per_node(ctx), ctx.epoch_scales())
    except UserError as exc:
        return str(exc)
    ctx.plan = plan
    emulated = ctx.rates or plan.rates
    return {"rates": plan.rates, "epoch_limits": epoch_limits(ctx.spec, emulated),
            "own_decoding": plan.policy.own_decoding}


def run_role(ctx, options: TrainOptions) -> None:
    """The rank's loop. Each role imports only its own modules: a preprocessor never loads
    torch, whose import would steal a core from the others just as the run starts."""
    role = ctx.topology.placements[ctx.rank].role
    coordinator = _start_coordinator(ctx, options) if ctx.rank == 0 else None
    if role is Role.TRAINER:

        TrainerLoop(ctx).run()
    else:

        PreprocessorLoop(ctx).run()
    if coordinator is not None:
        coordinator.join()
        if coordinator.error is not None:
            raise coordinator.error


class CoordinatorThread(threading.Thread):
    def __init__(self, ctx, options: TrainOptions):
        super().__init__(name="coordinator", daemon=True)
        self.ctx, self.options = ctx, options
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            _coordinate(self.ctx, self.options)
        except BaseException as exc:
            self.error = exc
            detail = "".join(traceback.format_exception_only(type(exc), exc)).strip().replace("\n", " ")
            if os.environ.get("FLEET_DEBUG"):
                traceback.print_exc()
            code = UserError.exit_code if isinstance(exc, UserError) else 3
            who = RankIdentity(0, "coordinator", 0, self.ctx.who.error_log)
            abort_job(self.ctx.world, who, detail, code=code)


def _start_coordinator(ctx, options: TrainOptions) -> CoordinatorThread:
    thread = CoordinatorThread(ctx, options)
    thread.start()
    return thread


def _coordinate(ctx, options: TrainOptions) -> None:
    spec, plan = ctx.spec, ctx.plan
    run_dir = Path(ctx.run_dir)
    console = Console(quiet=options.quiet, device=spec.cluster.device.value)
    collective = ctx.collective or resolve_backend(spec.runtime.collective, spec.cluster.device.value)
    log = EventLog(run_dir / "events.jsonl")
    started = time.monotonic()
    startup_s = started - ctx.process_start
    if plan.choice is not None:
        console.banner(f"policy auto: {plan.choice.describe()}")
    log.write("run_start", startup_s=startup_s, policy=plan.policy_name, gpus=spec.cluster.gpus, ranks=ctx.world.size,
              models=len(spec.models), resumed=plan.resumed, already_converged=plan.already_converged,
              rates=plan.rates_source, device=spec.cluster.device.value, collective=collective,
              early_stop=asdict(plan.early.settings) if plan.early else None,
              forecast=plan.forecast.to_record() if plan.forecast else None)
    if plan.forecast is not None:
        atomic_write_json(run_dir / "forecast.json", plan.forecast.gantt_record())
    console.banner(
        f"fleet: {spec.name}: {len(plan.ledger.views)} of {len(spec.models)} models to train with "
        f"{plan.policy_name} on {spec.cluster.nodes} node(s) x {spec.cluster.gpus_per_node} "
        f"{spec.cluster.device.value} trainer(s), {len(ctx.topology.preprocessor_ranks())} preprocessor(s); "
        f"rates {plan.rates_source}; groups reduce with {collective}"
    )

    for line in plan.fusion.lines():
        console.banner(line)
    for models, reason in plan.fusion.refused:
        log.write("bundle_refused", models=list(models), reason=reason)
    named = partial(policy_for, spec)
    candidates = switch_candidates(spec, plan)
    rechoose = (lambda current, view, costs, going_on: reconsider(current, view, named, costs, candidates,
                                                                 current_s=going_on)) if candidates else None
    coordinator = Coordinator(ctx, plan.policy, plan.ledger, plan.records, log, console,
                              make_policy=lambda: named(plan.policy_name), reconsider=rechoose, policy_named=named,
                              early=plan.early, host_use=host_use_of(ctx, plan),
                              ways=BundleWays(spec, plan.fusion.decided, log, console))
    coordinator.run()
    makespan = time.monotonic() - started
    result = write_run(ctx.spec, run_dir, coordinator, makespan, startup_s, plan)
    log.write("run_end", makespan=makespan, rounds=result.rounds, samples_decoded=result.samples_decoded,
              interrupted=result.interrupted)
    log.close()
    if result.interrupted:
        console.banner(
            f"checkpointed every model after {makespan:.1f} s on the checkpoint signal; run again with the same "
            f"run directory ({run_dir}) to resume (exit code {EXIT_CHECKPOINTED})"
        )
        return
    console.banner(
        f"done in {makespan:.1f} s, {result.rounds} round(s), {result.samples_decoded:,} samples decoded; "
        f"results in {run_dir / 'results.json'}"
    )
