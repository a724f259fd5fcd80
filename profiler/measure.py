"""Timing on one rank: a model trained by a trainer group, and preprocessing on a preprocessor.

Training is timed the way it runs: the same engines and collective backends, a small control
allreduce per step (as `GroupTraining` does), gradients summed across the group. A replica
that cannot be built, or runs out of memory, is reported as a failure with its reason; the
group agrees on it over MPI so that no member waits for one that has given up.
"""

from __future__ import annotations

import gc
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from fleet.engines import Framework, get_framework
from fleet.engines._base import host_device_name
from fleet.host import node_cores
from fleet.inspect import available_memory
from fleet.runtime.data.chunks import ChunkLayout
from fleet.runtime.train.checkpoint import CheckpointStore, ModelCheckpoint
from fleet.runtime.train.trainer import build_collective, build_engine
from fleet.runtime.waiting import IDLE, wait_request


def profile_batch(ctx, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """`batch_size` training samples, decoded and augmented once per process and reused."""
    cache = ctx.profile_batches
    if batch_size not in cache:
        rng = np.random.default_rng(ctx.spec.seed)
        train = ctx.train_idx
        indices = np.sort(rng.choice(train, size=batch_size, replace=len(train) < batch_size))
        raw = ctx.reader.read(indices)
        cache[batch_size] = (ctx.pipeline(raw, rng, train=True), raw.labels)
    return cache[batch_size]


def describe_failure(exc: BaseException) -> str:
    """One line: why a model could not be profiled."""
    name = type(exc).__name__
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else name
    if name == "OutOfMemoryError" or isinstance(exc, MemoryError) or "out of memory" in text.lower():
        return f"out of memory: {text[:200]}"
    return f"{name}: {text[:200]}"


def _group_failed(group_comm: Any, failed: bool, what: str, timeout_s: float, backoff=None) -> bool:
    """True when any member of the group failed (an allreduce polled like the data plane's)."""
    from mpi4py import MPI

    if group_comm.size == 1:
        return failed
    flags = np.array([1.0 if failed else 0.0])
    wait_request(group_comm.Iallreduce(MPI.IN_PLACE, flags, op=MPI.SUM), what, timeout_s, backoff)
    return flags[0] > 0


def framework_of(ctx, model) -> Framework | None:
    """The framework that trains `model` here; None on the emulated device, which uses none."""
    return None if ctx.device == "emulated" else get_framework(model.framework)


def device_name(framework: Framework | None, device: str) -> str:
    """What this trainer runs on: the GPU's name, or the processor's."""
    return framework.device_name(device) if framework is not None else host_device_name(device)


def _synchronize(framework: Framework | None, device: str) -> None:
    if framework is not None:
        framework.synchronize(device)


def _release_memory(framework: Framework | None, device: str) -> None:
    gc.collect()  # the dropped engine's memory goes now, so that the framework can free its cache
    if framework is not None:
        framework.release_memory(device)


TRAINING_STATE_FACTOR = 4  # weights, gradients and up to two optimizer buffers per parameter


def parameter_bytes(ctx, model) -> int | None:
    """Bytes of `model`'s parameters, counted by its framework's zoo without allocating them;
    None when that cannot be done (then the real build decides)."""
    zoo = get_framework(model.framework).zoo
    return zoo.parameter_bytes(model.family, model.params, ctx.input_shape, ctx.num_classes)


def free_memory_bytes(ctx, framework: Framework) -> int | None:
    """Memory this trainer may use: free memory of its GPU, or its share of the node's
    available host memory; None when unknown."""
    free = framework.free_device_memory(ctx.device)
    if free is not None:
        return free
    available = available_memory()
    if available is None:
        return None
    node = ctx.topology.node_of(ctx.rank)
    return available // max(1, len(ctx.topology.trainer_ranks(node)))


def does_not_fit(ctx, model) -> str | None:
    """Why `model` cannot fit on this trainer, judged before building it (a model far too big
    would otherwise be killed by the kernel's OOM killer, which no process can report)."""
    if ctx.device == "emulated":
        return None
    size, free = parameter_bytes(ctx, model), free_memory_bytes(ctx, get_framework(model.framework))
    if size is None or free is None or TRAINING_STATE_FACTOR * size <= free:
        return None
    gib = 2**30
    return (f"out of memory: needs at least {TRAINING_STATE_FACTOR * size / gib:,.1f} GiB for parameters, "
            f"gradients and optimizer state; {free / gib:,.1f} GiB free on {ctx.device}")


def time_training(ctx, model_id: str, group_comm: Any, batches: int, timed: int) -> dict:
    """Train `model_id` on this group for `batches` steps, timing the last `timed`.

    Every member calls it; every member returns the same ``{"rate": samples/s, "step_s": s}``
    or ``{"failed": reason}`` (the first reason seen on this rank, else a member's).
    """
    model = ctx.spec.model(model_id)
    framework = framework_of(ctx, model)
    size, timeout = group_comm.size, ctx.timeout_s
    engine = collective = None
    reason = does_not_fit(ctx, model)
    if reason is None:
        try:
            engine = build_engine(ctx, model, size)
            collective = build_collective(ctx, group_comm)
            collective.broadcast_engine(engine)
        except Exception as exc:  # a model that cannot be built is a result, not a crash
            reason = describe_failure(exc)
    if _group_failed(group_comm, reason is not None, f"the group building {model_id}", timeout, IDLE):
        reason = reason or "another member of the group failed to build it"
        return _finish(engine, collective, framework, ctx.device, reason)
    x, y = profile_batch(ctx, model.train.batch_size)
    started = cpu_started = None
    for step in range(batches):
        if step == batches - timed:
            _synchronize(framework, ctx.device)
            started, cpu_started = time.perf_counter(), time.process_time()
        try:
            if size == 1:
                engine.train_step(x, y)  # as a lone trainer steps (one compiled call for Keras)
            else:
                engine.compute_gradients(x, y)
        except Exception as exc:
            reason = describe_failure(exc)
        if _group_failed(group_comm, reason is not None, f"a step of {model_id}", timeout):
            return _finish(engine, collective, framework, ctx.device, reason or "another member of the group failed")
        if size > 1:
            collective.allreduce_gradients(engine)
            engine.apply_gradients()
    _synchronize(framework, ctx.device)
    elapsed = time.perf_counter() - started
    cpu_s = time.process_time() - cpu_started
    alone = alone_seconds(ctx, elapsed, cpu_s)
    result = {"rate": size * len(x) * timed / alone, "step_s": alone / timed,
              "parameters": int(engine.num_parameters), "device_name": device_name(framework, ctx.device)}
    if alone < elapsed:
        result["wall_rate"] = size * len(x) * timed / elapsed
    if size == 1 and ctx.device != "emulated":
        result.update(time_checkpoint(ctx.run_dir, model_id, engine))
        result["eval_rate"] = time_evaluation(ctx, engine, x, y)
    _finish(engine, collective, framework, ctx.device, None)
    return result


def time_checkpoint(run_dir: str, model_id: str, engine) -> dict:
    """Seconds to save the model as a run checkpoints it (its state, written, synced and
    committed in the run directory's file system) and to load it back: ``checkpoint_s`` and
    ``restore_s``. The files go to a scratch directory in the run directory, removed after."""
    scratch = Path(tempfile.mkdtemp(prefix=".timing-", dir=run_dir))
    try:
        store = CheckpointStore(scratch, keep=1)
        started = time.perf_counter()
        store.save(ModelCheckpoint(model_id=model_id, engine_state=engine.state_bytes(), stop={}))
        saved = time.perf_counter()
        engine.load_state_bytes(store.load(model_id).engine_state)
        return {"checkpoint_s": saved - started, "restore_s": time.perf_counter() - saved}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


EVAL_SAMPLES = 256  # samples of a timed validation pass (one of the engines' evaluation batches)


def time_evaluation(ctx, engine, x: np.ndarray, y: np.ndarray) -> float:
    """Samples/s of a validation pass as an epoch's end runs it (`evaluate_with_probabilities`,
    in eval mode, without gradients) on `EVAL_SAMPLES` of the timed batch's samples, after one
    warm-up pass, on the same clock as the steps (`alone_seconds`)."""
    reps = -(-EVAL_SAMPLES // len(x))
    xs, ys = np.concatenate([x] * reps)[:EVAL_SAMPLES], np.concatenate([y] * reps)[:EVAL_SAMPLES]
    engine.evaluate_with_probabilities(xs, ys)
    started, cpu_started = time.perf_counter(), time.process_time()
    engine.evaluate_with_probabilities(xs, ys)
    alone = alone_seconds(ctx, time.perf_counter() - started, time.process_time() - cpu_started)
    return len(xs) / max(alone, 1e-9)


def alone_seconds(ctx, elapsed: float, cpu_s: float) -> float:
    """Seconds the timed steps would take with the node's cores to this trainer alone.

    On a CPU device the profile times several trainers at once on the same cores (and a
    node's ranks may outnumber them), so the wall time depends on what else ran. Its CPU time
    over the cores it can use does not: that is the rate the simulator shares the cores out
    from (`fleet.schedule.cores`). A GPU's steps are timed on the wall clock, as they run."""
    if ctx.device != "cpu":
        return elapsed
    usable = min(ctx.spec.cluster.threads_per_trainer, node_cores())
    return min(elapsed, max(cpu_s, 1e-9) / usable)


def _finish(engine, collective, framework: Framework | None, device: str, reason: str | None) -> dict:
    if collective is not None:
        collective.close()
    del engine
    _release_memory(framework, device)
    return {"failed": reason} if reason else {}


def time_decoding(ctx, seconds: float) -> dict:
    """Decode and augment chunks of the training split for about `seconds`: samples/s by the
    wall clock, and the CPU seconds they took (the core-seconds a sample costs, whatever else
    ran on the node's cores)."""
    chunk = ctx.chunk_samples
    layout = ChunkLayout(chunk, ctx.input_shape)
    buffer = layout.new_buffer()
    rng = np.random.default_rng([ctx.spec.seed, ctx.rank])
    order = rng.permutation(ctx.train_idx)
    samples, k = 0, 0
    started, cpu_started = time.perf_counter(), time.thread_time()
    while k < 2 or time.perf_counter() - started < seconds:
        indices = np.sort(order[(k * chunk) % len(order):][:chunk])
        raw = ctx.reader.read(indices)
        ctx.pipeline(raw, rng, train=True, out=layout.images(buffer)[: len(indices)])
        samples += len(indices)
        k += 1
    elapsed, cpu_s = time.perf_counter() - started, time.thread_time() - cpu_started
    return {"samples": samples, "seconds": elapsed, "rate": samples / elapsed, "cpu_s": cpu_s}
