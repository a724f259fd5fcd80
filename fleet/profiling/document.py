"""``profile.json``: what the profiler writes, and whether a run may reuse it (pure).

The rate part (``schema``, ``gpus_per_node``, ``samples_per_epoch``, ``models[].rates``) is
what `fleet plan`, `fleet simulate` and the runtime read. The profiler adds, under a
versioned ``profiler`` block: when and how it measured, a fingerprint of what the rates
depend on (models, batch sizes, input shape, device, threads, collective), the hardware,
per-measurement details, failures and the preprocessors' throughput.
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from fleet.profiling import contention
from fleet.profiling.plan import decode_capacity, speed_key
from fleet.schedule.cores import SharedCores, assumed_costs
from fleet.schedule.costs import Overheads
from fleet.schedule.rates import is_positive_number

PROFILER_VERSION = 1


def fingerprint(spec) -> str:
    """A digest of everything in `spec` the measured rates depend on: per model, its id and
    its `speed_key`. A learning rate, schedule, `max_epochs`, stop rule or seed changed in the
    spec keeps the profile (the same models time the same)."""
    facts = {
        "models": [[m.id, speed_key(m)] for m in spec.models],  # the id covers the emulated device's own rates
        "data": {k: v for k, v in spec.data.model_dump(mode="json").items() if k not in ("path",)},
        "preprocess": [op.model_dump(mode="json") if hasattr(op, "model_dump") else op for op in spec.preprocess],
        "device": spec.cluster.device.value,
        "gpus_per_node": spec.cluster.gpus_per_node,
        "threads_per_trainer": spec.cluster.threads_per_trainer,
        "collective": spec.runtime.collective,
    }
    return hashlib.sha256(json.dumps(facts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def reuse_verdict(document: Mapping[str, Any] | None, spec) -> tuple[bool, str]:
    """Whether a run of `spec` may plan with `document` (a loaded profile.json), and why.

    A profile the profiler wrote is reused when its fingerprint matches; one without a
    ``profiler`` block was written by hand (or by a simulation) and is taken as given.
    """
    if document is None:
        return False, "no profile.json"
    block = document.get("profiler")
    if not isinstance(block, Mapping):
        return True, "a profile.json written by hand (no 'profiler' block): used as given"
    if block.get("fingerprint") != fingerprint(spec):
        return False, "profile.json was measured for other models, data or hardware"
    missing = {m.id for m in spec.models} - {m.get("id") for m in document.get("models", [])} - {
        f.get("id") for f in document.get("failures", [])
    }
    if missing:
        return False, f"profile.json lacks {len(missing)} model(s) of the spec"
    return True, "measured for this ensemble"


def epochs_estimate(rates, spec) -> list[float]:
    """Per model: the profile's `epochs` when given, else the spec's max_epochs."""
    out = []
    for profile in rates.models:
        epochs = getattr(profile, "epochs", None)
        out.append(float(epochs) if epochs else float(spec.model(profile.id).train.max_epochs))
    return out


def model_rates(measured: Mapping[int, Mapping[str, Any]]) -> dict[str, float]:
    """``{"1": r1, "2": r2, ...}`` from measurements by m, up to the first m that failed or is missing."""
    rates: dict[str, float] = {}
    m = 1
    while m in measured and "rate" in measured[m]:
        rates[str(m)] = float(measured[m]["rate"])
        m += 1
    return rates


def build_document(
    spec,
    samples_per_epoch: int,
    measured: Mapping[str, Mapping[int, Mapping[str, Any]]],
    preprocessing: Mapping[str, Any],
    hardware: Mapping[str, Any],
    timing: Mapping[str, Any],
    timed_as: Mapping[str, str] | None = None,
) -> dict:
    """The profile.json dict.

    Args:
        measured: per model id, per m: ``{"rate", "step_s", "gpus"}`` or ``{"failed": reason, "gpus"}``.
        timed_as: model id -> the id whose measurements stand for it (`fleet.profiling.plan.timed_as`);
            such a model's entry names it under ``timed_as``.
        preprocessing: the preprocessors' block (``samples_per_s`` by process count, ...).
        hardware: device, device name, hosts, versions.
        timing: started/finished timestamps, seconds, batches, timed, m_t.
    """
    models, failures = [], []
    for model in spec.models:
        source = (timed_as or {}).get(model.id, model.id)
        by_m = measured.get(source, {})
        rates = model_rates(by_m)
        for m, entry in sorted(by_m.items()):
            if "failed" in entry:
                failures.append({"id": model.id, "gpus": m, "reason": entry["failed"]})
        if not rates:
            if not any(f["id"] == model.id for f in failures):
                failures.append({"id": model.id, "gpus": 1, "reason": "not measured"})
            continue
        entry: dict[str, Any] = {
            "id": model.id,
            "rates": rates,
            "batch_size": model.train.batch_size,
            "step_s": {str(m): round(float(e["step_s"]), 6) for m, e in sorted(by_m.items()) if "step_s" in e},
            "trainers": {str(m): e["gpus"] for m, e in sorted(by_m.items()) if "gpus" in e},
        }
        if source != model.id:
            entry["timed_as"] = source
        parameters = by_m.get(1, {}).get("parameters")
        if parameters:
            entry["param_bytes"] = 4 * int(parameters)  # float32
        for cost in ("checkpoint_s", "restore_s", "eval_rate"):  # as a run saves, loads, validates: on one trainer
            if cost in by_m.get(1, {}):
                entry[cost] = round(float(by_m[1][cost]), 6)
        models.append(entry)
    return {
        "schema": 1,
        "gpus_per_node": spec.cluster.gpus_per_node,
        "samples_per_epoch": int(samples_per_epoch),
        "models": models,
        "failures": failures,
        "preprocessing": dict(preprocessing),
        "hardware": dict(hardware),
        "profiler": {"version": PROFILER_VERSION, "fingerprint": fingerprint(spec), **dict(timing)},
    }


def stream_demand(plan: Mapping[str, Any], rate_of) -> list[float]:
    """Per round of a plan document: samples/s its streams consume together (each stream at
    its slowest member's rate, decoded once). `rate_of(model, m)` gives r_i(m)."""
    demand = []
    for rnd in plan.get("rounds", []):
        streams: dict[Any, float] = {}
        for member in rnd["members"]:
            rate = rate_of(member["model"], len(member["gpus"]))
            key = member.get("stream", member["model"])
            streams[key] = min(streams.get(key, rate), rate)
        demand.append(sum(streams.values()))
    return demand


def decode_rates(block: Mapping[str, Any]) -> dict[int, float]:
    """``{k: samples/s}`` from a profile's preprocessing block."""
    return {int(k): float(v) for k, v in block.get("samples_per_s", {}).items()}


def decode_limit(extra: Mapping[str, Any], nodes: int, per_node: int | str | None = None) -> float | None:
    """Samples/s a run's preprocessors decode together, from a profile's extra fields
    (`RateTable.extra`): `per_node` processes on each of `nodes` (as profiled when it is not
    a number: None, or the spec's "auto"). None when the profile measured no decoding."""
    block = extra.get("preprocessing", {})
    count = per_node if isinstance(per_node, int) else int(block.get("per_node", 0) or 0)
    return decode_capacity(decode_rates(block), count, nodes)


def shared_cores(extra: Mapping[str, Any], device: str | None = None, threads: int | None = None,
                 cores: int | None = None, nodes_per_host: int = 1) -> SharedCores | None:
    """The cores a CPU run's trainers and preprocessors share (`fleet.schedule.cores`), from a
    profile's extra fields: `cores` (a running job's node's), else the node's cores it recorded,
    shared by `nodes_per_host` nodes (virtual nodes on one machine), its
    threads per trainer (else `threads`), one preprocessor's measured decoding (else
    decoding costs no core), and how much faster the cores
    work switching between fewer threads than in its waves, where its contention probe measured
    it (`fleet.profiling.contention`). On the emulated device the steps sleep and use no core, but the
    decoding does. None on GPUs (whose steps use no core of the node, and whose nodes have
    cores to spare), or where the cores are unknown: a profile measured before profiles
    recorded them timed its trainers on the wall clock, beside each other, and is taken as it is."""
    hardware = extra.get("hardware", {}) if isinstance(extra.get("hardware"), Mapping) else {}
    device = device or hardware.get("device")
    if device not in ("cpu", "emulated"):
        return None
    recorded = _positive(hardware.get("cores_per_node"))
    if hardware and not recorded:
        return None
    cores = cores or recorded
    if not cores:
        return None
    threads = threads or _positive(hardware.get("threads_per_trainer")) or 1
    sharing = SharedCores(cores=float(cores), trainer_cores=float(min(threads, cores)) if device == "cpu" else 0.0,
                          nodes_per_host=max(1, nodes_per_host),
                          decode_core_s=_decode_core_s(extra.get("preprocessing", {})))
    if device != "cpu":
        return sharing
    probed = contention.read(hardware)
    if probed:
        sharing = replace(sharing, contention=probed[0], rates_load=probed[1])
    return assumed_costs(sharing)


def _decode_core_s(block: Any) -> float:
    """Core-seconds one preprocessor spent per sample decoded: its CPU time where the profile
    measured it (the same on a busy node as on an idle one), else one over its samples/s."""
    if isinstance(block, Mapping) and _positive(block.get("core_s")) is not None:
        return float(block["core_s"])
    one = decode_rates(block).get(1) if isinstance(block, Mapping) else None
    return 1.0 / one if one and one > 0 else 0.0


def preprocessor_count(per_node: int | str | None, extra: Mapping[str, Any], nodes: int) -> int:
    """A run's preprocessor processes on `nodes` nodes: `per_node` each (a spec's setting; as
    profiled where it says ``auto``, at least one)."""
    if not isinstance(per_node, int):
        block = extra.get("preprocessing", {})
        per_node = int(block.get("per_node", 0) or 1) if isinstance(block, Mapping) else 1
    return per_node * nodes


def _positive(value: Any) -> float | None:
    return value if is_positive_number(value) else None


def measured_saves(rates) -> Overheads | None:
    """The checkpoint and restore costs a profile (or timed steps) measured on the run
    directory's file system: each costs the median of the models' measured saves (their sizes
    are in it); None where nothing was measured."""
    saves = [p.extra["checkpoint_s"] for p in rates.models if _positive(p.extra.get("checkpoint_s")) is not None]
    if not saves:
        return None
    return Overheads(latency_s=statistics.median(saves), bandwidth=math.inf)


JOIN_CHUNKS = 3
"""Chunks a member joining a running stream waits for the stream to pass: the runtime switches
members `fleet.runtime.protocol.INBOX_DEPTH` (2) chunks past the one its preprocessors decode
next, and that one too."""


def join_samples(extra: Mapping[str, Any]) -> float:
    """Samples a member joining a running stream waits for (`JOIN_CHUNKS` of the chunks the
    profile's or timed steps' preprocessors decoded); 0 where they did not say."""
    block = extra.get("preprocessing")
    chunk = _positive(block.get("chunk_samples")) if isinstance(block, Mapping) else None
    return JOIN_CHUNKS * chunk if chunk else 0.0


def summarize_failures(failures: Sequence[Mapping[str, Any]]) -> list[str]:
    return [f"{f['id']} on {f['gpus']} GPU(s): {f['reason']}" for f in failures]
