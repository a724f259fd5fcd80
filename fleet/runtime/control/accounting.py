"""Run accounting on rank 0: what results.json and plan.json say of a run.

Per model: its epochs, history, convergence and GPU time (`ModelRecord`). For the run: the
checkpoint and start costs the ranks reported (their means price a re-plan for the rate
weighing), validation samples decoded, and the members of every round as launched (plan.json).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fleet.report.results import EARLY_STOP_REASON
from fleet.runtime.control.measured_costs import MeasuredCosts
from fleet.runtime.protocol import EpochReport, MemberLeft
from fleet.schedule.costs import Overheads


@dataclass
class ModelRecord:
    """What the coordinator knows of one model, for results.json."""

    family: str
    parameters: int = 0
    epochs: int = 0
    history: list[dict] = field(default_factory=list)
    converged: bool = False
    stop_reason: str | None = None
    gpu_seconds: float = 0.0
    rung: int | None = None  # early stopping stopped it at this rung (its index among the model's rungs)

    def stopped_early(self, rung: int | None) -> None:
        """Early stopping ended the model at its rung of index `rung` (None: not known)."""
        self.converged, self.stop_reason, self.rung = True, EARLY_STOP_REASON, rung


class RunAccount:
    """The books of one run's results (not its scheduling state: that is the `Ledger`).

    Attributes:
        records: a `ModelRecord` per model of the spec.
        checkpoint_s: masters' save seconds, summed over models.
        checkpoint_gpu_s: the same, times each group's size (its trainers wait for the save).
        val_decoded: validation samples decoded by all masters.
        plan_rounds: plan.json's rounds, each ``{"index", "members": [{model, gpus, stream}]}``.
    """

    def __init__(self, records: dict[str, ModelRecord]):
        self.records = records
        self.checkpoint_s = 0.0
        self.checkpoint_gpu_s = 0.0
        self.saves = 0  # checkpoints counted in checkpoint_s
        self.start_s, self.starts = 0.0, 0  # members' starts (StartMember to first batch): sum, count
        self.fresh_start_s, self.fresh_starts = 0.0, 0  # ... of those that did not join a running stream
        self.joins: set[str] = set()  # models whose pending start joins a running stream
        self.val_decoded = 0
        self.plan_rounds: list[dict] = []
        self.costs = MeasuredCosts()

    # -- reports ------------------------------------------------------------------------------

    def epoch(self, report: EpochReport, group_size: int) -> ModelRecord:
        """An epoch report of a model training on `group_size` GPUs; returns its record."""
        record = self.records[report.model]
        record.epochs = report.epoch
        record.history.append({k: v for k, v in report.__dict__.items() if k not in ("model", "stop_reason", "bundle")})
        self.count_checkpoint(report.checkpoint_s, group_size)
        self._count_start(report.model, report.start_s)
        if not report.bundle:  # a bundle's rates and CPU time are not its models' own
            self.costs.epoch(report, group_size)
        if report.stop_reason is not None:
            record.converged, record.stop_reason = True, report.stop_reason
        return record

    def left(self, report: MemberLeft) -> None:
        """A group reported that it left its stream (its GPU time, parameters, validation work)."""
        record = self.records[report.model]
        record.gpu_seconds = report.gpu_seconds
        record.parameters = report.parameters
        self.val_decoded += report.val_decoded
        self._count_start(report.model, report.start_s)
        self.joins.discard(report.model)  # its start ended, counted or not (a join left before any data)
        if not report.converged:
            record.epochs = report.epochs

    def count_checkpoint(self, seconds: float, group_size: int) -> None:
        self.checkpoint_s += seconds
        self.checkpoint_gpu_s += seconds * max(1, group_size)
        self.saves += seconds > 0

    def joined(self, models) -> None:
        """`models` start by joining a running stream (their starts wait for its chunks)."""
        self.joins.update(models)

    def _count_start(self, model: str, seconds: float) -> None:
        if seconds > 0:
            self.start_s += seconds
            self.starts += 1
            if model in self.joins:
                self.joins.discard(model)
            else:
                self.fresh_start_s += seconds
                self.fresh_starts += 1

    def measured_overheads(self) -> Overheads:
        """This run's costs, for the simulations that weigh a change of rates, and for the
        change itself (a moved model pays a checkpoint and a restore): a checkpoint or a restore
        takes the mean save so far (else 1 s), whatever the model's size, and every member's
        start the mean start so far (set-up and first data). Not the simulator's default, a
        cluster's 5 s each, which made every extra round of a plan look 10 s dearer than it is."""
        each = self.checkpoint_s / self.saves if self.saves else 1.0
        start = self.start_s / self.starts if self.starts else 0.0
        return Overheads(latency_s=each, bandwidth=float("inf"), planning_s=0.0, start_s=start)

    def measured_costs(self, makespan: float, core_share: float | None = None) -> dict:
        """results.json's ``prediction.measured``: what this run's steps, trainers,
        preprocessors, coordinator (over `makespan`), starts and saves cost, and the part of an
        oversubscribed CPU node's cores its work got (`MeasuredCosts`)."""
        return self.costs.record(self.start_s / self.starts if self.starts else None,
                                 self.checkpoint_s / self.saves if self.saves else None, makespan, core_share,
                                 self.fresh_start_s / self.fresh_starts if self.fresh_starts else None)

    # -- plan.json ----------------------------------------------------------------------------

    def new_round(self, index: int) -> None:
        self.plan_rounds.append({"index": index, "members": []})

    def record_member(self, model: str, gpus: tuple[int, ...], stream: int) -> None:
        self.plan_rounds[-1]["members"].append({"model": model, "gpus": list(gpus), "stream": stream})

    def rerecord(self, models: set[str], stream: int, to: int | None) -> None:
        """Members of `models` recorded in `stream` move to stream `to`, or are dropped (None):
        a join that became a stream of its own, or never happened."""
        members = self.plan_rounds[-1]["members"]
        for member in [m for m in members if m["model"] in models and m["stream"] == stream]:
            if to is None:
                members.remove(member)
            else:
                member["stream"] = to
