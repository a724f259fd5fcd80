"""Predicting with what an earlier run of the same spec measured (pure).

A run keeps what its steps, trainers, preprocessors, starts and saves cost (``results.json``'s
``prediction.measured``, written by `fleet.runtime.control.measured_costs`). A later run of the
same spec (``fleet run --calibrate-from DIR``, or a resumed job from its own directory) predicts
and plans with those instead of what it would otherwise assume:

- each model's rates: where it trained on ``m`` trainers, the rate its steps reached there (by
  their CPU time on a CPU node: the rate with the cores to itself; by the wall clock on GPUs;
  none on the emulated device, whose steps take the profile's times by construction);
  on other group sizes the table's rate times the same correction; a model the earlier run did
  not train, the table's rates times the median correction of those it did; models the profile
  timed as one (``timed_as``: the same steps) take the geometric mean of what was measured of
  them, since they differ only by the noise of their measurement;
- on CPU nodes the profile's probe oversubscribed, how much a step slows with the load per core
  in a run (`Calibration.in_run_contention`): the measured rates, below the table's at the
  probe's load, tell how much more the run's threads slowed the steps than the probe's did;
- on CPU nodes, the trainers' core-seconds per sample outside their steps, the
  preprocessors' per sample decoded (their hand-offs included), in place of the profile's bare
  decoding, the cores the coordinator kept busy and those a trainer's or an idle
  preprocessor's polling kept busy;
- the decoding limit: the preprocessors' cores over what a sample cost them;
- a member's start and a checkpoint's seconds, as measured; where the earlier run told fresh
  starts from joins into running streams, the fresh ones, and a join waits for its stream's
  chunks at the stream's pace as without a calibration (a pilot of one policy then prices
  the joins of another by their own stream);
- the part of a member's time its epochs' ends take (validation, save, best predictions:
  ``epoch_end_share``), in which it takes nothing from its stream: every rate is that much lower;
- on CPU nodes that the earlier run oversubscribed, the part of the cores its work got
  (``core_share``: the cores' seconds its measured costs account for).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from fleet.schedule.cores import SharedCores
from fleet.schedule.costs import Overheads
from fleet.schedule.rates import ModelProfile, RateTable, is_number, is_positive_number
from fleet.schedule.scenario import Scenario


class CalibrationError(ValueError):
    """A measured record that cannot be used; the message names the field."""


@dataclass(frozen=True)
class Calibration:
    """What an earlier run measured, as the predictions take it.

    Attributes:
        source: what measured it (e.g. ``the run in DIR``), for messages and results.json.
        rates: per model, ``{trainers: samples/s}`` its steps reached.
        trainer_overhead_s: core-seconds per sample a member's trainers spent outside their steps
            (a member of one trainer, where the earlier run had some).
        group_overhead_s: the same per trainer of a member of several trainers (its share of the
            stream, its allreduce), recorded as ``group_trainer_overhead_s``.
        decode_core_s: core-seconds per sample the preprocessors spent.
        coordinator_cores: cores the coordinator thread kept busy (on the first node).
        start_s: a member's mean start (launch to first batch), seconds.
        fresh_start_s: the same of the members that did not join a running stream; None where
            the earlier run did not tell them apart (then `start_s` holds the joins' waits).
        checkpoint_s: a save's mean seconds.
        trainer_wait_cores, preprocessor_wait_cores: the cores a trainer's stream thread kept
            busy polling for data over its member's stay in the stream, and a preprocessor's
            loop while its streams had no room.
        core_share: the part of an oversubscribed CPU node's cores the work got.
        launch_s, tail_s: the earlier job's wall time before its ranks' start-up (its launch)
            and after its first step was due (the first batch's wait, the report, the ranks'
            shutdown), for the predicted wall time (with the start-up the job itself measures);
            None where not recorded (not started by `fleet run`).
    """

    source: str
    rates: Mapping[str, Mapping[int, float]] = field(default_factory=dict)
    trainer_overhead_s: float | None = None
    group_overhead_s: float | None = None
    decode_core_s: float | None = None
    coordinator_cores: float | None = None
    start_s: float | None = None
    fresh_start_s: float | None = None
    checkpoint_s: float | None = None
    trainer_wait_cores: float | None = None
    preprocessor_wait_cores: float | None = None
    core_share: float | None = None
    launch_s: float | None = None
    tail_s: float | None = None
    epoch_end_share: float = 0.0

    @classmethod
    def from_record(cls, record: Any, device: str, source: str, overhead: Any = None) -> Calibration:
        """From ``prediction.measured`` of a run on `device` (``cpu``: the CPU-time rates), and
        its results.json's ``overhead_s`` (`overhead`) for the time outside the makespan.

        Raises:
            CalibrationError: a field is not what a run writes there.
        """
        if not isinstance(record, Mapping):
            raise CalibrationError("prediction.measured: not an object")
        key = "cpu_rate" if device == "cpu" else "compute_rate"
        figures = {name: _figure(record, name) for name in
                   ("trainer_overhead_s", "decode_core_s", "coordinator_cores", "start_s", "fresh_start_s",
                    "checkpoint_s", "trainer_wait_cores", "preprocessor_wait_cores")}
        # per trainer of a group; a run before 2026-11-29 booked it per member (`group_overhead_s`):
        # not comparable across group sizes, so such a record's groups take `trainer_overhead_s`
        figures["group_overhead_s"] = _figure(record, "group_trainer_overhead_s")
        share = _figure(record, "core_share")
        if share is not None and not 0 < share <= 1:
            raise CalibrationError(f"prediction.measured.core_share: expected a number in (0, 1], got {share!r}")
        end = _figure(record, "epoch_end_share") or 0.0
        if not end < 1:
            raise CalibrationError(f"prediction.measured.epoch_end_share: expected a number in [0, 1), got {end!r}")
        rates = _rates(record.get("rates", {}), key)
        if device == "emulated":  # its steps sleep for the profile's times by construction: what
            rates = {}            # its clock adds is its host's load, which the cores model prices
        return cls(source, rates, **figures, core_share=share,
                   **_outside(overhead), epoch_end_share=end)

    def rates_for(self, table: RateTable) -> RateTable:
        """`table` with each model's rates corrected by what was measured, its epochs' ends
        included (see the module)."""
        pooled, factors = self._corrections(table)
        default = _median(factors)
        on_stream = 1.0 - self.epoch_end_share
        models = []
        for profile in table.models:
            factor = factors[profile.id] or default
            measured = pooled.get(profile.id, {})
            rates = tuple(measured.get(m, r * factor) * on_stream for m, r in enumerate(profile.rates, start=1))
            models.append(ModelProfile(profile.id, rates, profile.epochs, profile.param_bytes, profile.extra))
        return RateTable(tuple(models), table.gpus_per_node, table.samples_per_epoch, table.extra)

    def median_factor(self, table: RateTable) -> float:
        """The median over `table`'s measured models of their measured over their table rates
        (1 where none was measured)."""
        return _median(self._corrections(table)[1])

    def _corrections(self, table: RateTable) -> tuple[dict[str, dict[int, float]], dict[str, float | None]]:
        """Each model's measured rates (`_pooled`) and their correction of its table rates
        (`_factor`; None: not measured)."""
        pooled = self._pooled(table)
        return pooled, {p.id: self._factor(p, pooled.get(p.id, {})) for p in table.models}

    def _pooled(self, table: RateTable) -> dict[str, dict[int, float]]:
        """The measured rates of `table`'s models, each model's the geometric mean, per group
        size, over the models timed as one (``timed_as``: the same architecture, batch size and
        optimizer, so the same steps): they differ only by the noise of their measurement, and
        a simulation that took them apart would have one end its stream before its twins."""
        timed_as = {p.id: p.extra.get("timed_as") or p.id for p in table.models}
        by_group: dict[str, dict[int, list[float]]] = {}
        for model, rates in self.rates.items():
            for m, rate in rates.items():
                by_group.setdefault(timed_as.get(model, model), {}).setdefault(m, []).append(rate)
        means = {group: {m: _geometric_mean(rates) for m, rates in sizes.items()} for group, sizes in by_group.items()}
        return {p.id: means[timed_as[p.id]] for p in table.models if timed_as[p.id] in means}

    @staticmethod
    def _factor(profile: ModelProfile, measured: Mapping[int, float]) -> float | None:
        """The `measured` over the table's rate, in the mean over the group sizes measured."""
        ratios = [rate / profile.rates[m - 1] for m, rate in measured.items()
                  if m <= len(profile.rates) and profile.rates[m - 1] > 0]
        return _geometric_mean(ratios) if ratios else None

    def cores(self, cores: SharedCores | None, table: RateTable | None = None) -> SharedCores | None:
        """`cores` with the measured costs per sample and share of the cores (unchanged off CPU
        nodes); with the `table` the measured rates correct, the contention they were measured
        under (`in_run_contention`)."""
        if cores is None:
            return None
        if table is not None:
            cores = replace(cores, contention=self.in_run_contention(cores, table))
        changes = {name: value for name, value in (("trainer_overhead_s", self.trainer_overhead_s),
                                                   ("group_overhead_s", self.group_overhead_s),
                                                   ("decode_core_s", self.decode_core_s),
                                                   ("coordinator_cores", self.coordinator_cores),
                                                   ("trainer_wait_cores", self.trainer_wait_cores),
                                                   ("preprocessor_wait_cores", self.preprocessor_wait_cores),
                                                   ("share", self.core_share))
                   if value is not None}
        return replace(cores, **changes)

    def in_run_contention(self, cores: SharedCores, table: RateTable) -> float:
        """How much a core's work per sample grows per unit of load per core above one in a
        run, where the profile's probe measured `cores.contention` at `cores.rates_load`
        beside plain steps: a run's steps share the cores with its stream threads,
        preprocessors and coordinator too, and the measured rates came out slower than the
        table's at that load by `median_factor`. The runs' own steps alone on the cores go
        as fast as the probe's alone (runs on a 2-core VM: a member alone 1.25-1.35 times as
        fast as beside three others, the probe 1.12-1.15), so the contention that takes the
        probe's alone rate down to the measured ones at that load is the run's; never below
        the probe's."""
        load = cores.rates_load
        if load <= 1.0 or not self.rates:
            return cores.contention
        grown = (1.0 + cores.contention * (load - 1.0)) / self.median_factor(table)
        return max(cores.contention, (grown - 1.0) / (load - 1.0))

    def decode_rate(self, preprocessors: int, rate: float | None) -> float | None:
        """Samples/s `preprocessors` decode at the measured cost per sample (else `rate`)."""
        if not self.decode_core_s or preprocessors < 1:
            return rate
        return preprocessors / self.decode_core_s

    def scenario(self, scenario: Scenario, preprocessors: int) -> Scenario:
        """`scenario` as the measures predict it: its rates corrected, its cores' costs per
        sample and its `preprocessors`' decoding limit as measured."""
        return replace(scenario, rates=self.rates_for(scenario.rates), cores=self.cores(scenario.cores, scenario.rates),
                       decode_rate=self.decode_rate(preprocessors, scenario.decode_rate))

    def overheads(self, base: Overheads) -> Overheads:
        """`base` with the measured save (as each checkpoint's and restore's cost) and start:
        the mean of the earlier run's fresh starts, a join still waiting for `base`'s
        `join_samples` of its stream; of a run that did not tell them apart, the mean of all its
        members' starts, its joins' waits in it."""
        if self.checkpoint_s is not None:
            base = replace(base, latency_s=self.checkpoint_s, bandwidth=math.inf)
        if self.fresh_start_s is not None:
            return replace(base, start_s=self.fresh_start_s)
        return base if self.start_s is None else replace(base, start_s=self.start_s, join_samples=0.0)


ASSUMED_TAIL_S = 3.0
"""Seconds from a job's last step to its exit (its first batch's wait, rank 0's report, the
ranks' shutdown) where no earlier job measured them, besides `ASSUMED_TAIL_PER_MODEL_S`:
bench/predict.py's runs on a 2-core VM took 3.0-3.4 s for 8 models, 3.7-4.2 s for 32."""
ASSUMED_TAIL_PER_MODEL_S = 0.03
"""... and per model of the job (the report's rows and charts)."""


def predicted_wall_s(launch_s: float, startup_s: float, makespan_s: float, models: int,
                     tail_s: float | None = None) -> float:
    """The wall time of `fleet run` predicted: the launch and start-up (profile or timed steps
    included) as they took before the first step, the predicted `makespan_s`, and the tail
    (the first batch's wait, the report, the shutdown) as an earlier job of the same spec
    measured it (`tail_s`), else as assumed for `models` models."""
    if tail_s is None:
        tail_s = ASSUMED_TAIL_S + ASSUMED_TAIL_PER_MODEL_S * models
    return launch_s + startup_s + makespan_s + tail_s


def _outside(overhead: Any) -> dict[str, float | None]:
    """An earlier job's seconds before and after what its ranks' start-up and makespan take
    (`launch_s`, `tail_s`), where `fleet run` recorded them (else None)."""
    if not isinstance(overhead, Mapping) or not all(k in overhead for k in ("launch", "shutdown")):
        return {"launch_s": None, "tail_s": None}
    parts = {k: overhead.get(k, 0.0) for k in ("launch", "startup", "first_batch", "shutdown")}
    if not all(is_number(p) and p >= 0 for p in parts.values()):
        raise CalibrationError("overhead_s: expected seconds >= 0 for launch, startup, first_batch and shutdown")
    return {"launch_s": float(parts["launch"]), "tail_s": float(parts["first_batch"] + parts["shutdown"])}


def _figure(record: Mapping, name: str) -> float | None:
    value = record.get(name)
    if value is None:
        return None
    if not is_number(value) or value < 0:
        raise CalibrationError(f"prediction.measured.{name}: expected a number >= 0, got {value!r:.60}")
    return float(value)


def _rates(block: Any, key: str) -> dict[str, dict[int, float]]:
    """``{model: {trainers: rate}}`` from ``prediction.measured.rates``."""
    if not isinstance(block, Mapping):
        raise CalibrationError("prediction.measured.rates: not an object")
    rates: dict[str, dict[int, float]] = {}
    for model, by_size in block.items():
        where = f"prediction.measured.rates.{model!s:.60}"
        if not isinstance(by_size, Mapping):
            raise CalibrationError(f"{where}: not an object")
        for size, entry in by_size.items():
            if size == "0":  # booked by runs before 2026-11-28 from a report that came after its GPUs went
                continue
            if not (isinstance(size, str) and size.isdigit() and int(size) >= 1) or not isinstance(entry, Mapping):
                raise CalibrationError(f"{where}: expected {{trainers: {{{key}: samples/s}}}}, got key {size!r:.30}")
            rate = entry.get(key)
            if rate is None:
                continue
            if not is_positive_number(rate):
                raise CalibrationError(f"{where}.{size}.{key}: expected a positive number, got {rate!r:.60}")
            rates.setdefault(str(model), {})[int(size)] = float(rate)
    return rates


def _geometric_mean(values: list[float]) -> float:
    """The geometric mean of positive `values` (one value: itself, exactly)."""
    return values[0] if len(values) == 1 else math.exp(statistics.fmean(math.log(v) for v in values))


def _median(factors: Mapping[str, float | None]) -> float:
    """The median of the known `factors` (1 where none is)."""
    known = [f for f in factors.values() if f is not None]
    return statistics.median(known) if known else 1.0
