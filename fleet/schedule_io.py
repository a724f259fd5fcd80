"""Files around the scheduling core: ``profile.json`` in, ``plan.json`` out.

:mod:`fleet.schedule` is pure; this module is where its inputs and outputs touch the disk.
Every problem a user can cause becomes a :class:`~fleet.errors.UserError` naming the file
and the field.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from fleet.atomic import atomic_write_json
from fleet.errors import UserError
from fleet.profiling.document import decode_limit, preprocessor_count, shared_cores
from fleet.schedule.calibration import Calibration, CalibrationError
from fleet.schedule.rates import ProfileFormatError, RateTable
from fleet.schedule.simulator import Cluster, Scenario, SimResult

PLAN_SCHEMA = 1


def load_profile(path: str | os.PathLike) -> RateTable:
    """Read the rate part of ``profile.json``.

    Raises:
        UserError: missing or unreadable file, invalid JSON, or a malformed field.
    """
    text = _read_text(path)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    try:
        return RateTable.from_dict(data)
    except ProfileFormatError as exc:
        raise UserError(f"{path}: {exc.field}: {exc.problem}") from None


def save_profile(rates: RateTable, path: str | os.PathLike) -> None:
    """Write ``rates`` as ``profile.json`` (extra fields it was loaded with are kept)."""
    write_json(path, rates.to_dict())


def profile_scenario(
    rates: RateTable, truth: Sequence[int], estimates: Sequence[float], gpus: int,
    preprocessors_per_node: int | str | None = None, virtual_nodes: bool = False,
) -> Scenario:
    """The simulated run of a profile on `gpus` GPUs, decoding limited to what the profile
    measured its preprocessors decode (`preprocessors_per_node` of them, or as profiled; each
    stream from those the runtime would give it), a
    stream decoded in its own trainer process (Baseline's) to what one of them decodes, and
    on CPU nodes the cores they all share (as many as the profile's node had; `virtual_nodes`:
    one machine's, shared by all the nodes)."""
    cluster = Cluster(gpus, rates.gpus_per_node)
    limit = decode_limit(rates.extra, cluster.nodes, preprocessors_per_node)
    per_node = math.ceil(preprocessor_count(preprocessors_per_node, rates.extra, cluster.nodes) / cluster.nodes)
    return Scenario(rates, tuple(truth), tuple(estimates), cluster, decode_rate=limit,
                    own_decode_rate=decode_limit(rates.extra, 1, 1),  # one process's
                    cores=shared_cores(rates.extra, nodes_per_host=cluster.nodes if virtual_nodes else 1),
                    preprocessors_per_node=per_node)


PILOT = "pilot"  # profile.json's block of what a pilot run measured (`fleet profile --pilot`)


def pilot_calibration(rates: RateTable, device: str, where: str = "profile.json") -> Calibration | None:
    """What the profile's pilot run measured of its costs (``fleet profile --pilot``), for
    predictions on `device`; None where the profile has no pilot, or one that ran on another
    device. An emulated run (its steps sleep for the profile's times) takes a CPU pilot's costs
    on the host (decoding, the trainers' work outside their steps, starts, saves, the part of
    the cores the work got) but not its rates, nor what its groups' allreduce of real gradients
    cost.

    Raises:
        UserError: the pilot block is malformed (one line naming `where` and the field).
    """
    block = rates.extra.get(PILOT)
    if block is None:
        return None
    if not isinstance(block, dict) or not isinstance(block.get("measured"), dict):
        raise UserError(f"{where}: {PILOT}: expected an object with the pilot run's 'measured' costs")
    ran_on = block.get("device", device)
    if ran_on != device and (ran_on, device) != ("cpu", "emulated"):
        return None
    try:
        calibration = Calibration.from_record(block["measured"], ran_on,
                                              f"the profile's pilot run ({block.get('seconds', '?')} s)",
                                              block.get("overhead_s"))
    except CalibrationError as exc:
        raise UserError(f"{where}: {PILOT}.{exc}") from None
    # the emulated device's steps take the profile's times and its groups allreduce a few
    # stand-in parameters: of a CPU pilot, all but its rates and its groups' allreduce of real
    # gradients (each trainer of a group is priced as one of one trainer)
    return calibration if ran_on == device else replace(calibration, rates={}, group_overhead_s=None)


def load_calibration(run_dir: Path, device: str, required: bool) -> Calibration | None:
    """What the run in `run_dir` measured of its costs (its results.json's
    ``prediction.measured``), for predictions on `device`; None where it has none and it is
    not `required` (a run directory whose job has not finished yet, or an older run's).

    Raises:
        UserError: it is `required` and missing, or it is there and malformed (one line naming
            the file and the field).
    """
    path = run_dir / "results.json"
    where = f"--calibrate-from {run_dir}" if required else str(path)
    if not path.is_file():
        if required:
            raise UserError(f"{where}: no results.json there (the directory of a finished fleet run is needed)")
        return None
    try:
        document = json.loads(_read_text(path))
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    measured = document.get("prediction", {}).get("measured") if isinstance(document, dict) and isinstance(
        document.get("prediction"), dict) else None
    if measured is None:
        if required:
            raise UserError(f"{where}: its results.json has no prediction.measured (a run by an older fleet?)")
        return None
    try:
        return Calibration.from_record(measured, device, f"the run in {run_dir}", document.get("overhead_s"))
    except CalibrationError as exc:
        raise UserError(f"{path}: {exc}") from None


def epochs_from_profile(
    rates: RateTable, max_epochs: float | None, path: str | os.PathLike = "profile.json"
) -> tuple[tuple[float, ...], str]:
    """Epochs to plan with, and where they came from.

    Uses each model's ``epochs`` from the profile; models without one get ``max_epochs``.

    Returns:
        ``(epochs, source)`` where source is ``"profile"``, ``"max-epochs"`` or
        ``"profile + max-epochs"``.

    Raises:
        UserError: a model has no ``epochs`` and no ``max_epochs`` was given.
    """
    missing = [k for k, p in enumerate(rates.models) if p.epochs is None]
    if missing and max_epochs is None:
        raise UserError(
            f"{path}: models[{missing[0]}].epochs: missing (and {len(missing) - 1} more); "
            "pass --max-epochs to plan with an estimate"
        )
    epochs = tuple(float(max_epochs if p.epochs is None else p.epochs) for p in rates.models)
    if not missing:
        return epochs, "profile"
    return epochs, "max-epochs" if len(missing) == len(rates.models) else "profile + max-epochs"


def plan_document(result: SimResult, gpus_per_node: int, epochs_source: str, lb2: float | None = None) -> dict:
    """The ``plan.json`` dict of a simulated run (every round, stream and member)."""
    rounds = []
    for rnd in result.timeline.rounds:
        members = [
            {
                "model": m.model,
                "gpus": list(m.gpus),
                "nodes": sorted({g // gpus_per_node for g in m.gpus}),
                "stream": m.stream,
                "start": round(m.start, 3),
                "end": round(m.end, 3),
                "outcome": m.outcome.value,
                "epochs": [round(m.epochs_start, 3), round(m.epochs_end, 3)],
            }
            for m in result.timeline.members
            if m.round == rnd.index
        ]
        rounds.append({"index": rnd.index, "start": round(rnd.start, 3), "end": round(rnd.end, 3), "members": members})
    doc: dict[str, Any] = {
        "schema": PLAN_SCHEMA,
        "policy": result.policy,
        "gpus_per_node": gpus_per_node,
        "total_gpus": result.total_gpus,
        "epochs_source": epochs_source,
        "makespan_s": round(result.makespan, 3),
        "samples_decoded": round(result.samples_decoded, 1),
        "rounds": rounds,
    }
    if lb2 is not None:
        doc["lower_bound_s"] = round(lb2, 3)
    return doc


def write_json(path: str | os.PathLike, data: Any) -> None:
    """Write ``data`` as JSON atomically (see `fleet.atomic`); an unwritable path is a UserError."""
    atomic_write_json(path, data)






def _read_text(path: str | os.PathLike) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise UserError(f"{path}: is a directory, expected profile.json") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: cannot read: {exc}") from None
