"""The profiling phase of a job: every rank takes part, rank 0 decides and writes profile.json.

Rank 0 sends each step to every rank (a non-spinning broadcast) and gathers the results:
``train`` steps time a wave of (model, m) measurements on disjoint trainer groups (all
m = 1 first, then m = 2..M_t once M_t is known); ``decode`` steps time k = 1, 2, 4, ...
preprocessor processes decoding at once; ``done`` ends the phase.
"""

from __future__ import annotations

import datetime as dt
import platform
import statistics
import time
from typing import Any

from fleet.engines import get_framework
from fleet.inspect import search_costs
from fleet.profiling import contention, timed_steps
from fleet.profiling.document import build_document, fingerprint
from fleet.profiling.plan import DECODE_SECONDS, Measurement, preprocessor_counts, threshold_gpus, timed_as, waves
from fleet.runtime.rank import job_cores_per_node
from fleet.runtime.train.trainer import create_group_comm
from fleet.runtime.waiting import bcast_object, recv_object, send_object
from fleet.spec.sections import Device
from profiler.measure import time_decoding, time_training

RESULT_TAG = 91


def run_profiling(ctx, say=print) -> dict | None:
    """Profile the spec's models and preprocessing; profile.json's dict on rank 0, None elsewhere."""
    if ctx.rank != 0:
        _serve(ctx)
        return None
    return _Driver(ctx, say).run()


def run_timed_steps(ctx, models: list[str], groups: list[str], say=print) -> dict | None:
    """A few timed steps of `models` (one trainer each; `groups` of them on 2 .. a node's
    trainers too) and one preprocessor's decoding, for the estimates of a job that does not
    profile (`fleet.profiling.timed_steps`); steps.json's dict on rank 0, None elsewhere."""
    if ctx.rank != 0:
        _serve(ctx)
        return None
    return _Driver(ctx, say).timed_steps(models, groups)


def _serve(ctx) -> None:
    while True:
        step = bcast_object(ctx.world, None, 0, "the next profiling step from rank 0", ctx.timeout_s)
        if step[0] == "done":
            return
        result = _execute(ctx, step)
        send_object(ctx.world, result, 0, RESULT_TAG, "rank 0 to take a profiling result", ctx.timeout_s)


def _execute(ctx, step: tuple) -> Any:
    """This rank's part of one step: None when it has none."""
    kind = step[0]
    if kind == "train":
        _, jobs, batches, timed = step
        for model, ranks, uid in jobs:
            if ctx.rank in ranks:
                return _time_group(ctx, model, ranks, uid, batches, timed)
        return None
    if kind == "decode":
        _, ranks, seconds = step
        return time_decoding(ctx, seconds) if ctx.rank in ranks else None
    raise ValueError(f"unknown profiling step {kind!r}")


def _time_group(ctx, model: str, ranks: tuple[int, ...], uid: int, batches: int, timed: int) -> dict | None:
    ctx.who.role = f"profiling {model} on {len(ranks)} trainer(s)"
    comm = create_group_comm(ctx.group_parent, ranks, uid)
    try:
        result = time_training(ctx, model, comm, batches, timed)
    finally:
        comm.Free()
        ctx.who.role = "trainer"
    return result if ranks[0] == ctx.rank else None


class _Driver:
    """Rank 0's side: chooses the steps, takes part in them, gathers and writes up."""

    def __init__(self, ctx, say):
        self.ctx, self.say = ctx, say
        self.spec = ctx.spec
        self.topology = ctx.topology
        self.gpus = self.spec.cluster.gpus
        self.uid = 0
        self.timed_as = timed_as(self.spec.models, emulated=self.spec.cluster.device is Device.EMULATED)
        self.measured: dict[str, dict[int, dict]] = {m: {} for m in self.timed_as.values()}

    def run(self) -> dict:
        started, began = dt.datetime.now(dt.timezone.utc), time.monotonic()
        sched = self.spec.scheduler
        ids = list(self.measured)
        self.say(f"profile: {len(ids)} models on {self.gpus} trainer(s): {sched.profile_batches} batches each, "
                 f"timing the last {sched.profile_timed}{self._shared_note()}")
        self._measure([(model, 1) for model in ids], sched.profile_batches, sched.profile_timed)
        single = self._on_one_trainer("rate")
        m_t = threshold_gpus(single, self.spec.cluster.gpus_per_node, self.gpus)
        self.say(f"profile: M_t = {m_t} (rates beyond it follow Eq. 5)")
        self._measure([(model, m) for m in range(2, m_t + 1) for model in single], sched.profile_batches,
                      sched.profile_timed)
        probed = self._probe_contention(single, sched.profile_batches, sched.profile_timed)
        preprocessing = self._measure_decoding(preprocessor_counts(len(self.topology.preprocessor_ranks())),
                                               DECODE_SECONDS)
        self._step(("done",))
        finished = dt.datetime.now(dt.timezone.utc)
        timing = {
            "started": started.isoformat(timespec="seconds"), "finished": finished.isoformat(timespec="seconds"),
            "seconds": round(time.monotonic() - began, 3), "batches": sched.profile_batches,
            "timed": sched.profile_timed, "m_t": m_t,
        }
        document = build_document(self.spec, self.ctx.epoch_samples, self.measured, preprocessing,
                                  self._hardware(probed), timing, self.timed_as)
        searches = search_costs(self.spec, self.ctx.num_classes)  # what plans say of adaptive searches
        return {**document, "searches": searches} if searches else document

    def timed_steps(self, models: list[str], groups: list[str]) -> dict:
        """steps.json's dict: `models` timed for a few steps on one trainer each (`groups` of
        them on 2 .. a node's trainers too: `group_steps`), and one preprocessor's decoding."""
        began = time.monotonic()
        counts = timed_steps.group_counts(self.spec.cluster.gpus_per_node, self.gpus) if groups else []
        self.say(f"timing {timed_steps.TIMED} steps of {len(models)} model(s) on one trainer each"
                 + (f" ({len(groups)} on {counts[0]}-{counts[-1]} trainers too)" if counts else "")
                 + ", to correct the rates estimated from FLOPs")
        self.measured = {m: {} for m in models}
        self._measure([(model, 1) for model in models], timed_steps.BATCHES, timed_steps.TIMED)
        timed = [model for model in groups if "step_s" in self.measured.get(model, {}).get(1, {})]
        self._measure([(model, m) for m in counts for model in timed], timed_steps.BATCHES, timed_steps.TIMED)
        probed = self._probe_contention(self._on_one_trainer("rate"), timed_steps.PROBE_BATCHES, timed_steps.PROBE_TIMED)
        preprocessing = self._measure_decoding((1,), timed_steps.DECODE_SECONDS)
        self._step(("done",))
        return {"schema": 1, "fingerprint": fingerprint(self.spec), "rates": self._on_one_trainer("rate"),
                "checkpoint_s": self._on_one_trainer("checkpoint_s"), "eval_rate": self._on_one_trainer("eval_rate"),
                "failed": self._on_one_trainer("failed"), "group_steps": self._group_steps(timed),
                "preprocessing": preprocessing, "hardware": self._hardware(probed),
                "seconds": round(time.monotonic() - began, 3)}

    def _group_steps(self, models: list[str]) -> dict:
        """Seconds per step of each of `models` by trainer count, where the count timed."""
        return {model: {str(m): e["step_s"] for m, e in sorted(self.measured[model].items()) if "step_s" in e}
                for model in models}

    def _on_one_trainer(self, key: str) -> dict:
        """Each model's `key` as measured on one trainer, where it has one."""
        return {m: e[1][key] for m, e in self.measured.items() if key in e.get(1, {})}

    def _shared_note(self) -> str:
        """How many spec models the timed ones stand for, when some train at the same speed."""
        shared = len(self.timed_as) - len(self.measured)
        if not shared:
            return ""
        return (f" ({len(self.timed_as)} in the spec: {shared} differ from a timed one only in learning rate, "
                "schedule, epochs or stop rule, and take its rates)")

    # -- steps ------------------------------------------------------------------------------

    def _step(self, step: tuple) -> list:
        """Broadcast `step`, do rank 0's part, and gather every rank's result (by rank)."""
        ctx = self.ctx
        bcast_object(ctx.world, step, 0, "every rank to take a profiling step", ctx.timeout_s)
        if step[0] == "done":
            return []
        results = [_execute(ctx, step)]
        for rank in range(1, ctx.world.size):
            results.append(recv_object(ctx.world, rank, RESULT_TAG, f"rank {rank}'s profiling result", ctx.timeout_s))
        return results

    def _measure(self, jobs: list[tuple[str, int]], batches: int, timed: int) -> None:
        planned = waves(jobs, self.spec.cluster.gpus_per_node, self.gpus)
        for k, wave in enumerate(planned, start=1):
            began = time.monotonic()
            step_jobs = [(job.model, self._ranks(job), self._next_uid()) for job in wave]
            results = self._step(("train", step_jobs, batches, timed))
            lines = []
            for job, (_, ranks, _) in zip(wave, step_jobs):
                result = dict(results[ranks[0]] or {"failed": "no result"}, gpus=list(job.gpus))
                self.measured[job.model][job.m] = result
                lines.append(f"{job.model}@{job.m}: " + (f"{result['rate']:,.0f}/s" if "rate" in result
                                                         else f"FAILED ({result['failed']})"))
            self.say(f"profile: wave {k}/{len(planned)} ({time.monotonic() - began:.1f} s): " + ", ".join(lines))

    def _probe_contention(self, rates: dict[str, float], batches: int, timed: int) -> dict | None:
        """On a CPU device whose trainers oversubscribe their machine's cores: the median
        model of `rates` timed on every trainer of the busiest machine at once, then alone
        (`fleet.profiling.contention`); None elsewhere."""
        model = contention.probe_model(rates)
        if self.spec.cluster.device is not Device.CPU or model is None:
            return None
        processes = self.ctx.processes
        hosts = [processes[r].rpartition(" ")[0] if r < len(processes) else "" for r in map(self.topology.trainer_rank,
                                                                                           range(self.gpus))]
        trainers = contention.busiest_host(hosts)
        load = contention.probe_load(len(trainers), self.spec.cluster.threads_per_trainer, job_cores_per_node(self.ctx))
        if load < contention.MIN_LOAD:
            return None
        steps = contention.probe_steps(rates[model], self.spec.model(model).train.batch_size, timed)
        batches = steps + max(0, batches - timed)  # as many warm-up steps as the measurements take
        beside = self._step(("train", [(model, (self.topology.trainer_rank(g),), self._next_uid()) for g in trainers],
                             batches, steps))
        alone = self._step(("train", [(model, (self.topology.trainer_rank(trainers[0]),), self._next_uid())],
                            batches, steps))
        rates_beside = [r["rate"] for r in beside if r and "rate" in r]
        rate_alone = (alone[self.topology.trainer_rank(trainers[0])] or {}).get("rate")
        if rate_alone is None or not rates_beside:
            return None
        block = contention.record(model, rate_alone, rates_beside, load)
        self.say(f"profile: contention probe: {model} {rate_alone:,.0f}/s alone, "
                 f"{statistics.median(rates_beside):,.0f}/s beside {len(trainers) - 1} other(s) "
                 f"(load {load:.2f} per core): slope {block.get('slope', 'not measured')}")
        return block

    def _measure_decoding(self, counts, seconds: float) -> dict:
        ranks = list(self.topology.preprocessor_ranks())
        rates: dict[str, float] = {}
        block: dict[str, Any] = {}
        for k in counts:
            results = self._step(("decode", tuple(ranks[:k]), seconds))
            rates[str(k)] = round(sum(results[r]["rate"] for r in ranks[:k]), 1)
            self.say(f"profile: {k} preprocessor(s) decode {rates[str(k)]:,.0f} samples/s")
            if k == 1 and results[ranks[0]]["cpu_s"] > 0:
                block["core_s"] = results[ranks[0]]["cpu_s"] / results[ranks[0]]["samples"]
        return {"samples_per_s": rates, **block, "chunk_samples": self.ctx.chunk_samples,
                "ranks": ranks, "per_node": len(self.topology.preprocessor_ranks(0))}

    def _ranks(self, job: Measurement) -> tuple[int, ...]:
        return tuple(self.topology.trainer_rank(g) for g in job.gpus)

    def _next_uid(self) -> int:
        self.uid += 1
        return 30_000 + self.uid

    def _hardware(self, probed: dict | None = None) -> dict:
        from mpi4py import MPI

        names = [e["device_name"] for by_m in self.measured.values() for e in by_m.values() if "device_name" in e]
        name = names[0] if names else self.spec.cluster.device.value
        return {
            "device": self.spec.cluster.device.value, "device_name": name, "host": platform.node(),
            "nodes": self.spec.cluster.nodes, "trainers": self.gpus,
            "preprocessors": len(self.topology.preprocessor_ranks()),
            "threads_per_trainer": self.spec.cluster.threads_per_trainer, "cores_per_node": job_cores_per_node(self.ctx),
            "cpu": platform.processor() or platform.machine(),
            "python": platform.python_version(), "frameworks": self._framework_versions(),
            "mpi": MPI.Get_library_version().replace("\x00", "").strip().splitlines()[0],
            **({"contention": probed} if probed else {}),
        }

    def _framework_versions(self) -> dict[str, str]:
        """The version of each framework the models train with (none on the emulated device)."""
        if self.spec.cluster.device is Device.EMULATED:
            return {}
        return {name: get_framework(name).version() for name in sorted({m.framework for m in self.spec.models})}
