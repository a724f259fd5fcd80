"""Rank 0's adaptive searches: a placeholder's values asked right before its first start, and
each asked model's result told to its study when it ends.

A model's ask goes to its study's journal first (`fleet.runtime.control.study`), then to a
synced line of ``search/asked.jsonl`` (`fleet.spec.asked`), then into the run's spec (and
``spec.yaml``), all before its `StartMember` goes out (which carries the asked model to its
ranks). A trial asked but never recorded is the next ask's (`Study.ask`); a model recorded
keeps its values across requeues. Told: the best value of the stop metric over the model's
epochs when it converges; a model early stopping stopped is a pruned trial, at its rung.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fleet.atomic import atomic_write_text
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
        if self.book is not None:  # a resumed run: results of models that ended before its last job told
            self.book.catch_up(*ended_results(records))

    def launching(self, models: Sequence[str]) -> None:
        """Placeholders about to start for the first time are asked now: recorded, and in the
        run's spec, before their `StartMember` goes out."""
        for model in models if self.book is not None else ():
            if self.book.ask(model) is not None:
                self.ctx.spec = self.book.spec
                record = self.book.asked[model]
                self.log.write("asked", model=model, study=record["study"], trial=record["trial"],
                               values=record["values"])
                self.console.left(model, f"asked by study {record['study']} (trial {record['trial']}): "
                                         f"{record['values']}")

    def ended(self, model: str) -> None:
        if self.book is not None:
            self.book.ended(model, self.records[model].history)

    def stopped(self, model: str, rung: int) -> None:
        if self.book is not None:
            self.book.stopped(model, self.records[model].history, rung)
