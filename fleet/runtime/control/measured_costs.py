"""What a run measured of its own costs, kept for the predictions of the runs after it.

Every epoch report carries the group's CPU seconds in its steps and in all (its trainers'
processes: receiving the stream, assembling batches, waiting), and every preprocessor's stream
report its process's CPU seconds so far. From them the run keeps, in ``results.json``'s
``prediction.measured``:

- per model and group size, the rate its steps reached by the wall clock (``compute_rate``)
  and by their CPU time (``cpu_rate``: the rate with the cores to itself on a CPU node);
- ``trainer_overhead_s``: core-seconds the trainers spent per sample outside their steps and
  their waits for data (of members of one trainer, where the run had some), and
  ``group_trainer_overhead_s``, the same per trainer of members of several (each trainer's share
  of the stream, its allreduce and the waits in it: a member of ``m`` trainers costs ``m``
  times that per sample of its stream);
- ``decode_core_s``: core-seconds the preprocessors' decoding loops spent per sample they
  decoded (their hand-offs included; not their rounds with nothing to do, their start-up, nor
  rank 0's coordinator);
- ``trainer_wait_cores`` and ``preprocessor_wait_cores``: the cores a trainer's stream thread
  kept busy polling for data over its member's stay in the stream (it waits for the next chunk
  while the trainer steps through the last), and a preprocessor's loop while its streams had
  no room (where the run had a second of such time);
- ``coordinator_cores``: the cores rank 0's coordinator thread kept busy, over the makespan;
- ``epoch_end_share``: the part of a member's time its epochs' ends took (its validation pass,
  its save and best predictions), in which it takes nothing from its stream;
- ``start_s`` and ``checkpoint_s``: a member's mean start and a save's mean seconds;
- ``core_share``, on CPU nodes whose ranks want more than their cores: the part of the cores
  the work the above account for got (`fleet.runtime.control.host_use`; the rest went to
  moments when every rank waited and to what the costs per sample leave out).

`fleet.schedule.calibration` turns such a record into the rates and costs a later run of the
same spec predicts with (``fleet run --calibrate-from DIR``; a resumed job learns from its own).
"""

from __future__ import annotations

from dataclasses import dataclass

from fleet.runtime.control.host_use import RANK0_ROLE
from fleet.runtime.protocol import EpochReport, MemberLeft, StreamDone


@dataclass
class _GroupTime:
    """One model on one group size: what its epochs took."""

    samples: int = 0
    step_cpu_s: float = 0.0
    cpu_s: float = 0.0
    compute_samples: int = 0
    compute_s: float = 0.0
    wait_cpu_s: float = 0.0  # the CPU seconds of its stream threads' polling for data
    stay_s: float = 0.0  # its trainers' seconds in their stream, in the epochs it reported whole ...
    stay_wait_cpu_s: float = 0.0  # ... and their polling's CPU seconds in them


class MeasuredCosts:
    """The run's books of what its steps, trainers and preprocessors cost."""

    def __init__(self) -> None:
        self.groups: dict[tuple[str, int], _GroupTime] = {}
        # rank -> [CPU seconds so far, samples decoded, idle seconds so far, their CPU seconds]
        self.preprocessors: dict[int, list[float]] = {}
        self.coordinator_cpu_s: float | None = None  # the coordinator thread's CPU seconds, once it ended
        self.epoch_s = 0.0  # the timed epochs' seconds on the stream ...
        self.end_s = 0.0  # ... and at their ends (validation, save, best predictions)
        self.end_cpu_s = 0.0  # the masters' CPU seconds in those ends

    def epoch(self, report: EpochReport, group_size: int) -> None:
        """An epoch report of a model training on `group_size` trainers (and its end, where timed).
        A report that arrives after its model's GPUs went (0 trainers: a stop or a checkpoint
        crossed it) says nothing of a group size."""
        if group_size >= 1:
            self._add(report.model, group_size, report.cpu, report.samples, report.samples_per_s, report.waits)
            if report.epoch_s > 0 and report.cpu[2] > 0:
                group = self.groups[(report.model, group_size)]
                group.stay_s += report.epoch_s * group_size
                group.stay_wait_cpu_s += max(0.0, report.waits[1])
        if report.end_s > 0 and report.epoch_s > 0:
            self.epoch_s += report.epoch_s
            self.end_s += report.end_s
            self.end_cpu_s += report.end_cpu_s

    def left(self, report: MemberLeft, group_size: int) -> None:
        """A model that left its stream mid-epoch (checkpointed) on `group_size` trainers: the
        part of the epoch it trained there counts as an epoch's would (a short run, a pilot,
        may end before any epoch does)."""
        if group_size >= 1:
            self._add(report.model, group_size, report.cpu, report.cpu[2], report.compute_rate, report.waits)

    def _add(self, model: str, group_size: int, cpu: tuple[float, float, int], samples: int, rate: float,
             waits: tuple[float, float] = (0.0, 0.0)) -> None:
        step_cpu_s, cpu_s, cpu_samples = cpu
        group = self.groups.setdefault((model, group_size), _GroupTime())
        if cpu_samples > 0 and step_cpu_s > 0:
            group.samples += cpu_samples
            group.step_cpu_s += step_cpu_s
            group.cpu_s += max(cpu_s, step_cpu_s)
            group.wait_cpu_s += min(max(0.0, waits[1]), max(0.0, cpu_s - step_cpu_s))
        if rate > 0 and samples > 0:
            group.compute_samples += samples
            group.compute_s += samples / rate

    def stream_done(self, report: StreamDone) -> None:
        """A preprocessor's report of a stream it finished (its decoding loop's CPU seconds so far)."""
        books = self.preprocessors.setdefault(report.rank, [0.0, 0.0, 0.0, 0.0])
        books[0] = max(books[0], report.cpu_s)
        books[1] += report.decoded
        books[2], books[3] = max(books[2], report.idle[0]), max(books[3], min(report.idle[1], report.cpu_s))

    def record(self, start_s: float | None, checkpoint_s: float | None, makespan: float = 0.0,
               core_share: float | None = None, fresh_start_s: float | None = None) -> dict:
        """``prediction.measured`` of results.json (figures it has no measure of are left out);
        `makespan`: the run's seconds, over which the coordinator's CPU is spread; `core_share`:
        the part of an oversubscribed CPU node's cores the work got (`core_share_over`);
        `fresh_start_s`: the mean start of members that did not join a running stream (a join
        also waits for the stream's chunks, which predictions price at the stream's pace)."""
        rates: dict[str, dict[str, dict[str, float]]] = {}
        for (model, size), group in sorted(self.groups.items()):
            entry = {}
            if group.compute_s > 0:
                entry["compute_rate"] = group.compute_samples / group.compute_s
            if group.step_cpu_s > 0:
                entry["cpu_rate"] = group.samples * size / group.step_cpu_s  # each member's steps: 1/size of the sum
            if entry:
                rates.setdefault(model, {})[str(size)] = entry
        record: dict = {"rates": rates}
        record.update(self._overheads())
        decoded = sum(books[1] for books in self.preprocessors.values())
        if decoded:
            record["decode_core_s"] = sum(books[0] - books[3] for books in self.preprocessors.values()) / decoded
        record.update(self._wait_cores())
        if self.end_s > 0:
            record["epoch_end_share"] = self.end_s / (self.epoch_s + self.end_s)
        if self.coordinator_cpu_s is not None and makespan > 0:
            record["coordinator_cores"] = self.coordinator_cpu_s / makespan
        for key, value in (("start_s", start_s), ("fresh_start_s", fresh_start_s), ("checkpoint_s", checkpoint_s)):
            if value is not None:
                record[key] = value
        if core_share is not None:
            record["core_share"] = core_share
        return record

    def _overheads(self) -> dict[str, float]:
        """``trainer_overhead_s``: the trainers' CPU seconds outside their steps per sample, of the
        members of one trainer where the run had some (else per trainer of the groups');
        ``group_trainer_overhead_s``: the same per trainer of members of several trainers (their
        allreduce and its waits), where it had some."""
        single = _outside_steps([(g, 1) for (_, size), g in self.groups.items() if size == 1])
        group = _outside_steps([(g, size) for (_, size), g in self.groups.items() if size > 1])
        record = {}
        if single is not None or group is not None:
            record["trainer_overhead_s"] = single if single is not None else group
        if group is not None:
            record["group_trainer_overhead_s"] = group
        return record

    def _wait_cores(self) -> dict[str, float]:
        """``trainer_wait_cores`` (per trainer over its stay in its stream) and
        ``preprocessor_wait_cores`` (per preprocessor over its idle rounds), where the run
        had enough of them (`MIN_WAIT_S`) to tell."""
        record = {}
        for key, seconds, cpu_s in (
                ("trainer_wait_cores", sum(g.stay_s for g in self.groups.values()),
                 sum(g.stay_wait_cpu_s for g in self.groups.values())),
                ("preprocessor_wait_cores", sum(b[2] for b in self.preprocessors.values()),
                 sum(b[3] for b in self.preprocessors.values()))):
            if seconds >= MIN_WAIT_S:
                record[key] = min(1.0, cpu_s / seconds)
        return record

    def accounted_core_s(self) -> float:
        """Core-seconds the run's measured costs account for: its trainers' (steps, the rest of
        their epochs and the ends of them), its preprocessors' decoding loops and its coordinator."""
        return sum(self.accounted_by_role().values())

    def accounted_by_role(self) -> dict[str, float]:
        """`accounted_core_s` per rank role (as `fleet.runtime.control.host_use` names them):
        the trainers', the preprocessors' other than rank 0, and rank 0's (its decoding loop and
        the coordinator)."""
        rank0 = self.preprocessors.get(0, [0.0])[0] + (self.coordinator_cpu_s or 0.0)
        others = sum(books[0] for rank, books in self.preprocessors.items() if rank != 0)
        trainers = sum(g.cpu_s for g in self.groups.values()) + self.end_cpu_s
        return {"trainer": trainers, "preprocessor": others, RANK0_ROLE: rank0}

    def host_cpu(self, measured: dict[str, float]) -> dict:
        """``prediction.measured.host_cpu``: per rank role, its ranks' CPU seconds as sampled
        (`measured`, `HostUse.cpu_by_role`) beside the seconds the costs above account for,
        and the samples the trainers trained and the preprocessors decoded (what the rest
        could be per)."""
        accounted = self.accounted_by_role()
        roles = {role: {"cpu_s": cpu, "accounted_s": accounted.get(role, 0.0)} for role, cpu in sorted(measured.items())}
        return {"roles": roles, "trained": sum(g.samples for g in self.groups.values()),
                "decoded": sum(books[1] for books in self.preprocessors.values())}

    def core_share_over(self, cores: float, makespan: float) -> float | None:
        """The core-seconds accounted for over `cores` x `makespan`: the part of the cores the
        work got, tail and all (where the ranks' own CPU was not sampled: `fleet.runtime.control.host_use`)."""
        accounted = self.accounted_core_s()
        return min(1.0, accounted / (cores * makespan)) if accounted > 0 and cores > 0 and makespan > 0 else None


MIN_WAIT_S = 1.0  # seconds (of stays, of idle rounds) under which the cores of their polling are not told


def _outside_steps(groups: list[tuple[_GroupTime, int]]) -> float | None:
    """`groups`' (each with its trainers) CPU seconds outside their steps and their waits for
    data, per sample and trainer (None without a sample)."""
    trainer_samples = sum(g.samples * size for g, size in groups)
    outside = sum(g.cpu_s - g.step_cpu_s - g.wait_cpu_s for g, _ in groups)
    return max(0.0, outside) / trainer_samples if trainer_samples else None
