"""Rank 0's adaptive searches: a placeholder's values asked right before its first start, and
each asked model's result told to its study when it ends.

A model's ask goes to its study's journal first (`fleet.runtime.control.study`), then to a
synced line of ``search/asked.jsonl`` (`fleet.spec.asked`), then into the run's spec (and
``spec.yaml``), all before its `StartMember` goes out (which carries the asked model to its
ranks). A trial asked but never recorded is the next ask's (`Study.ask`); a model recorded
keeps its values across requeues. Told: the best value of the stop metric over the model's
epochs when it converges; a model early stopping stopped is a pruned trial, at its rung.

A placeholder was planned at the rates of the space's middle values; once asked, its rates are
those times its FLOPs per sample over the asked model's (the estimator of unprofiled models,
`fleet.runtime.control.rates_source`), which `RunSearch.launching` returns for the driver
(`Driver.rates_estimated`) before the model starts: the planners see the asked architecture's
rates from then on, and measure them on their own.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from fleet.atomic import atomic_write_text
from fleet.errors import UserError
from fleet.inspect import describe_model
from fleet.runtime.control.rungs import lower_is_better
from fleet.runtime.control.study import Study
from fleet.spec import ModelSpec, Spec
from fleet.spec.asked import SEARCH_DIR, asked_path, read_asked, with_asked
from fleet.spec.load import asked_model
from fleet.spec.search import SearchSlot


def searched(spec: Spec) -> bool:
    """Whether `spec` has an adaptive search."""
    return any(m.search is not None for m in spec.models)


def ended_results(records: Mapping[str, Any]) -> tuple[dict[str, list], dict[str, int]]:
    """From a run's `ModelRecord`s: the ended models' histories, and those early stopping
    stopped with their rung's epochs (the last of their history)."""
    ended = {m: r.history for m, r in records.items() if r.converged}
    stopped = {m: len(r.history) for m, r in records.items() if r.converged and r.rung is not None}
    return ended, stopped


FlopsCounter = Callable[[Spec, str], int]
"""``(spec, model id) -> the model's forward FLOPs per sample``."""


def flops_counter(ctx: Any) -> FlopsCounter | None:
    """A run's `FlopsCounter`: its framework's zoo counts each architecture once, at the run's
    input shape and classes (`fleet.inspect.describe_model`); None on the emulated device, whose
    steps take each model's own rates (by id) whatever its architecture."""
    if ctx.device == "emulated":
        return None

    def count(spec: Spec, model_id: str) -> int:
        index = next(k for k, m in enumerate(spec.models) if m.id == model_id)
        return describe_model(spec, index, ctx.input_shape, ctx.num_classes).stats.flops_per_sample

    return count


def rate_factor(count: FlopsCounter, before: Spec, after: Spec, model_id: str) -> tuple[float | None, str]:
    """How much faster than planned asked model `model_id` is estimated to train: its FLOPs per
    sample as a placeholder (in `before`) over those asked (in `after`); None when they cannot
    be counted. With what to say of it."""
    try:
        planned, asked = (max(1, count(spec, model_id)) for spec in (before, after))
    except UserError as exc:
        return None, f"rates kept at the placeholder's (its FLOPs not counted: {exc})"
    factor = planned / asked
    return factor, f"planned at {factor:.3g}x the placeholder's rate ({planned / 1e6:,.3g} -> {asked / 1e6:,.3g} MFLOPs/sample)"


class SearchBook:
    """See the module docstring.

    Args:
        run_dir: the run directory (its ``search/`` holds the journals and ``asked.jsonl``).
        spec: the run's spec (placeholders and asked models alike).
    """

    def __init__(self, run_dir: str | os.PathLike, spec: Spec):
        self.run_dir = Path(run_dir)
        self.asked = read_asked(run_dir)
        self.spec = with_asked(spec, self.asked)
        self.studies: dict[str, Study] = {}

    def ask(self, model_id: str) -> ModelSpec | None:
        """Placeholder `model_id` asked and recorded (None: not a placeholder, or asked before)."""
        model = self.spec.model(model_id)
        if model.search is None or model_id in self.asked:
            return None
        slot = model.search
        claimed = {r["trial"] for r in self.asked.values() if r["study"] == slot.study}
        number, values = self._study(slot, model).ask(claimed)
        asked = asked_model(model, values)
        record = {"model": model_id, "study": slot.study, "trial": number, "values": values}
        path = asked_path(self.run_dir)
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps(record, allow_nan=False) + "\n")
            out.flush()
            os.fsync(out.fileno())
        self.asked[model_id] = record
        self.spec = self.spec.with_models({model_id: asked})
        atomic_write_text(self.run_dir / "spec.yaml", self.spec.to_yaml())
        return asked

    def ended(self, model_id: str, history: Sequence[Mapping]) -> None:
        """Asked model `model_id` converged: its best value over `history` told."""
        record = self.asked.get(model_id)
        if record is not None:
            model = self.spec.model(model_id)
            self._study(model.search, model).tell(record["trial"], self._best(model, history))

    def stopped(self, model_id: str, history: Sequence[Mapping], rung: int) -> None:
        """Asked model `model_id` was stopped early at its rung of `rung` epochs: pruned there."""
        record = self.asked.get(model_id)
        if record is not None:
            model = self.spec.model(model_id)
            value = self._best(model, history[:rung])
            self._study(model.search, model).prune(record["trial"], value, rung)

    def catch_up(self, ended: Mapping[str, Sequence[Mapping]], stopped: Mapping[str, int]) -> None:
        """A resumed run: tell the models that ended before a crash and were never told
        (`ended`: their histories; `stopped`: those early stopping stopped, at their rung)."""
        for model_id, history in ended.items():
            if model_id in stopped:
                self.stopped(model_id, history, stopped[model_id])
            else:
                self.ended(model_id, history)

    @staticmethod
    def _best(model: ModelSpec, history: Sequence[Mapping]) -> float | None:
        metric = model.train.stop.metric.value
        values = [v for v in (lower_is_better(h, metric) for h in history) if v is not None]
        if not values:
            return None
        return -min(values) if metric == "val_accuracy" else min(values)

    def _study(self, slot: SearchSlot, model: ModelSpec) -> Study:
        if slot.study not in self.studies:
            maximize = model.train.stop.metric.value == "val_accuracy"
            self.studies[slot.study] = Study(self.run_dir / SEARCH_DIR, slot.study, slot.sampler, slot.space,
                                             maximize, self.spec.seed)
        return self.studies[slot.study]


class RunSearch:
    """The coordinator's side of the run's searches (nothing where the spec has none): asks
    before launches, tells as models end, logs both.

    Args:
        ctx: the run (its spec is replaced by one with each asked model).
        records: the run's `ModelRecord`s (their histories are what is told).
        log, console: the event log and the console.
    """

    def __init__(self, ctx: Any, records: Mapping[str, Any], log: Any, console: Any):
        self.ctx, self.records, self.log, self.console = ctx, records, log, console
        self.book = SearchBook(ctx.run_dir, ctx.spec) if searched(ctx.spec) else None
        self.count = flops_counter(ctx) if self.book is not None else None
        if self.book is not None:  # a resumed run: results of models that ended before its last job told
            self.book.catch_up(*ended_results(records))

    def launching(self, models: Sequence[str]) -> dict[str, float]:
        """Placeholders about to start for the first time are asked now: recorded, and in the
        run's spec, before their `StartMember` goes out. Returns the factor of each asked
        model's planned rates (`rate_factor`), for `Driver.rates_estimated`."""
        factors: dict[str, float] = {}
        for model in models if self.book is not None else ():
            before = self.book.spec
            if self.book.ask(model) is None:
                continue
            self.ctx.spec = self.book.spec
            factor, said = (None, "") if self.count is None else rate_factor(self.count, before, self.book.spec, model)
            if factor is not None:
                factors[model] = factor
            record = self.book.asked[model]
            self.log.write("asked", model=model, study=record["study"], trial=record["trial"],
                           values=record["values"], rate_factor=factor)
            self.console.left(model, f"asked by study {record['study']} (trial {record['trial']}): "
                                     f"{record['values']}" + (f"; {said}" if said else ""))
        return factors

    def ended(self, model: str) -> None:
        if self.book is not None:
            self.book.ended(model, self.records[model].history)

    def stopped(self, model: str, rung: int) -> None:
        if self.book is not None:
            self.book.stopped(model, self.records[model].history, rung)
