"""A run's greedy ensemble: chosen from the models' kept validation predictions, scored on the
test split against the best single model, written to ``ensemble.json`` (run-directory.md
documents the file; the math is `fleet.report.greedy_ensemble`)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fleet.atomic import atomic_write_json
from fleet.errors import UserError
from fleet.report import html_page
from fleet.report.greedy_ensemble import as_stack, greedy_selection, scores
from fleet.report.predictions import RECORD, TEST, VALIDATION, KeptPredictions, read_kept, read_labels
from fleet.report.results import ModelResult, RunResult, group_results, leaderboard_rows, read_results
from preprocess.grouped import unique_parts

ENSEMBLE = "ensemble.json"
SCHEMA = 1
MAX_SIZE = 10_000
NO_TEST_NOTE = ("no test split (data.test_fraction is 0): scored on the validation split the ensemble was "
                "selected on, which flatters it")


@dataclass(frozen=True)
class Candidates:
    """The models greedy selection may take: the leaderboard's best first, with their kept predictions."""

    kept: tuple[KeptPredictions, ...]
    left_out: tuple[str, ...]  # models of the top N that kept no predictions
    metric: str

    @property
    def ids(self) -> list[str]:
        return [k.model for k in self.kept]


def check_size(size: int, what: str = "--size") -> int:
    """An ensemble size: 1 to `MAX_SIZE` (UserError naming `what`)."""
    if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= MAX_SIZE:
        raise UserError(f"{what}: expected a whole number of steps from 1 to {MAX_SIZE}, got {size!r}")
    return size


def _results(run_dir: Path) -> RunResult:
    try:
        return read_results(run_dir)
    except OSError:
        raise UserError(f"{run_dir}: no results.json: has a job finished (or been checkpointed) here?") from None
    except ValueError:
        raise UserError(f"{run_dir / 'results.json'}: not JSON (file corrupt?)") from None


def candidates(run_dir: Path, top: int | None, ranked: list[ModelResult] | None = None,
               group: str | None = None) -> Candidates:
    """The `top` best models of `run_dir`'s leaderboard (all where None) that kept predictions;
    of `ranked` (one group's models, best first; `group`: its id part) where given.

    Raises:
        UserError: no results.json, or no model kept predictions (a run of an older fleet).
    """
    if ranked is None:
        ranked = leaderboard_rows(_results(run_dir).models)
    ranked = [m for m in ranked if m.best_metric is not None][:top]
    found = {m.id: read_kept(run_dir, m.id) for m in ranked}
    kept = tuple(k for k in found.values() if k is not None)
    if not kept or read_labels(run_dir, VALIDATION, group) is None:
        raise UserError(f"{run_dir}: no saved predictions (predictions/<model>/{RECORD}): the run was made by a fleet "
                        "that kept none, on the emulated device, or with --local; train it again to keep them")
    return Candidates(kept, tuple(model for model, k in found.items() if k is None), ranked[0].metric)


def build_ensemble(run_dir: str | os.PathLike, size: int, top: int | None = None) -> dict:
    """The ``ensemble.json`` document of `run_dir`: greedy selection of `size` steps over the
    `top` best models; with groups (`data.group_by`), one per group (`group_ensembles`).

    Raises:
        UserError: bad arguments, or a run without kept predictions.
    """
    run_dir = Path(run_dir)
    check_size(size)
    if top is not None and (isinstance(top, bool) or not isinstance(top, int) or top < 1):
        raise UserError(f"--from: expected a number of models of at least 1, got {top!r}")
    run = _results(run_dir)
    if run.groups:
        return group_ensembles(run_dir, run, size, top)
    return select(run_dir, candidates(run_dir, top), size)


def select(run_dir: Path, pool: Candidates, size: int, group: str | None = None) -> dict:
    """Greedy selection of `size` steps over `pool` on the validation labels (of the group whose
    id part is `group`, where given), scored on the test split where every candidate has one."""
    labels = read_labels(run_dir, VALIDATION, group)
    chosen = greedy_selection(_stack(pool.kept, VALIDATION, labels), labels, size, start=0)
    test = read_labels(run_dir, TEST, group)
    split = TEST if test is not None and all(TEST in k.files for k in pool.kept) else VALIDATION
    split_labels = test if split == TEST else labels
    stack = _stack(pool.kept, split, split_labels)
    ids = pool.ids
    return {
        "schema": SCHEMA, "size": size, "from": len(ids), "kept": chosen.kept, "metric": pool.metric,
        "candidates": ids, "left_out": list(pool.left_out),
        "members": [{"model": ids[m], "count": int(chosen.counts[m]), "weight": float(chosen.weights[m])}
                    for m in np.flatnonzero(chosen.counts)],
        "curve": [{"step": k + 1, "added": ids[m], "val_nll": nll} for k, (m, nll) in
                  enumerate(zip(chosen.added, chosen.curve))],
        "evaluated_on": split, "note": "" if split == TEST else NO_TEST_NOTE,
        "ensemble": scores(stack, chosen.weights, split_labels),
        "best_single": {"model": ids[0], **scores(stack[:1], np.ones(1), split_labels)},
    }


def group_ensembles(run_dir: Path, run: RunResult, size: int, top: int | None) -> dict:
    """One ensemble per group, each of the group's own `top` best models, chosen on its
    validation split and scored on its test split: ``groups`` maps each group's raw key to the
    document `select` makes of it (the largest group first); a group none of whose models kept
    predictions yet is listed under ``left_out_groups``.

    Raises:
        UserError: no group has kept predictions.
    """
    parts = unique_parts(set(run.groups.values()))
    docs, left = {}, []
    for group in group_results(run.models, run.groups):
        try:
            pool = candidates(run_dir, top, list(group.ranked), parts[group.key])
        except UserError:
            left.append(group.key)
            continue
        docs[group.key] = {"group": group.key, **select(run_dir, pool, size, parts[group.key])}
    if not docs:
        raise UserError(f"{run_dir}: no saved predictions of any group (predictions/<model>/{RECORD}): the run was "
                        "made by a fleet that kept none, or on the emulated device; train it again to keep them")
    notes = {d["note"] for d in docs.values() if d["note"]}
    return {"schema": SCHEMA, "size": size, "from": top, "groups": docs, "left_out_groups": left,
            "evaluated_on": _splits(docs.values()), "note": " ".join(sorted(notes)),
            "ensemble": _pooled(docs.values(), "ensemble"), "best_single": _pooled(docs.values(), "best_single")}


def _splits(docs) -> str:
    splits = sorted({d["evaluated_on"] for d in docs})
    return splits[0] if len(splits) == 1 else " and ".join(splits)


def _pooled(docs, which: str) -> dict:
    """Accuracy and NLL over every group's scored samples together (each group's figure
    weighed by its samples), and the samples."""
    samples = sum(d[which]["samples"] for d in docs)
    pooled = {key: sum(d[which][key] * d[which]["samples"] for d in docs) / max(samples, 1)
              for key in ("accuracy", "nll")}
    return {**pooled, "samples": samples}


def _stack(kept: tuple[KeptPredictions, ...], split: str, labels: np.ndarray) -> np.ndarray:
    arrays = [k.probabilities(split) for k in kept]
    for k, probs in zip(kept, arrays):
        if probs.ndim != 2 or len(probs) != len(labels):
            raise UserError(f"{k.directory / k.files[split]}: {probs.shape} probabilities for {len(labels)} "
                            f"{split} labels (written by another run?)")
    if len({p.shape for p in arrays}) > 1:
        raise UserError(f"the kept {split} predictions have different numbers of classes (written by another run?)")
    return as_stack(arrays)


def write_ensemble(run_dir: str | os.PathLike, doc: dict) -> Path:
    path = Path(run_dir) / ENSEMBLE
    atomic_write_json(path, doc)
    return path


def read_ensemble(run_dir: str | os.PathLike) -> dict | None:
    """``ensemble.json`` of `run_dir`, or None when there is none or it cannot be read."""
    try:
        doc = json.loads((Path(run_dir) / ENSEMBLE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and doc.get("schema") == SCHEMA else None


def headline(doc: dict) -> str:
    """One line: the ensemble against the best single model, on the split it was scored on;
    with groups, every group's ensemble against its best single model, over all their samples."""
    ens, one = doc["ensemble"], doc["best_single"]
    if "groups" in doc:
        return (f"one per group, {len(doc['groups'])} group(s), on {doc['evaluated_on']}: accuracy "
                f"{ens['accuracy']:.4f}, NLL {ens['nll']:.4f} over their {ens['samples']:,} samples against each "
                f"group's best single model's {one['accuracy']:.4f}, {one['nll']:.4f}"
                + (f"; {len(doc['left_out_groups'])} group(s) without kept predictions" if doc["left_out_groups"] else ""))
    members = ", ".join(f"{m['model']} {m['weight']:.2f}" for m in doc["members"])
    return (f"{len(doc['members'])} model(s) ({members}) on {doc['evaluated_on']}: accuracy {ens['accuracy']:.4f}, "
            f"NLL {ens['nll']:.4f}, ECE {ens['ece']:.4f} against the best single model {one['model']}'s "
            f"{one['accuracy']:.4f}, {one['nll']:.4f}, {one['ece']:.4f}")


def say_ensemble(doc: dict, path: Path) -> None:
    """The console's lines about an ensemble written to `path`."""
    print(f"fleet: ensemble: {headline(doc)}; written to {path}", flush=True)
    if doc["note"]:
        print(f"fleet: note: {doc['note']}", flush=True)


SCORE_ROWS = (("accuracy", "accuracy"), ("NLL (nats)", "nll"), ("ECE (15 bins)", "ece"),
              ("mean predictive entropy", "entropy"), ("mutual information", "mutual_information"),
              ("disagreement", "disagreement"))


def ensemble_section(doc: dict) -> str:
    """The report's "ensemble" section: the members, then the scores beside the best model's;
    with groups, `group_ensembles_section`."""
    if "groups" in doc:
        return group_ensembles_section(doc)
    notes = [("members", ", ".join(f"{m['model']} x{m['count']} ({m['weight']:.2f})" for m in doc["members"])),
             ("selected", f"{doc['kept']} of {doc['size']} greedy steps on validation NLL, from the best "
                          f"{doc['from']} model(s)"),
             ("scored on", doc["evaluated_on"] + (f" ({doc['note']})" if doc.get("note") else ""))]
    ens, one = doc["ensemble"], doc["best_single"]
    rows = [(name, f"{ens[key]:.4f}", f"{one[key]:.4f}") for name, key in SCORE_ROWS]
    return html_page.key_values(notes) + html_page.table(("", "ensemble", f"best single ({one['model']})"), rows,
                                                         (False, True, True))


def group_ensembles_section(doc: dict) -> str:
    """The report's "ensemble" section with groups: the setting and the scores over every
    group's samples, then one row per group (the largest first): its members and its
    ensemble's accuracy and NLL beside its best single model's."""
    pool = "its own" + (f" {doc['from']} best" if doc["from"] else "") + " models"
    ens, one = doc["ensemble"], doc["best_single"]
    notes = [("ensembles", f"one per group: {len(doc['groups'])} group(s), each up to {doc['size']} greedy steps on "
                           f"its validation NLL, from {pool}"),
             ("scored on", f"{doc['evaluated_on']} of each group" + (f" ({doc['note']})" if doc.get("note") else "")),
             ("over all groups", f"accuracy {ens['accuracy']:.4f}, NLL {ens['nll']:.4f} on {ens['samples']:,} samples; "
                                 f"the best single model of each group: {one['accuracy']:.4f}, {one['nll']:.4f}")]
    if doc["left_out_groups"]:
        notes.append(("left out", f"{len(doc['left_out_groups'])} group(s) without kept predictions"))
    rows = [(key, ", ".join(f"{m['model']} x{m['count']}" for m in g["members"]), f"{g['ensemble']['accuracy']:.4f}",
             f"{g['best_single']['accuracy']:.4f}", f"{g['ensemble']['nll']:.4f}", f"{g['best_single']['nll']:.4f}",
             g["ensemble"]["samples"]) for key, g in doc["groups"].items()]
    return html_page.key_values(notes) + html_page.table(
        ("group", "members", "ensemble accuracy", "best single accuracy", "ensemble NLL", "best single NLL", "samples"),
        rows, (False, False, True, True, True, True, True))
