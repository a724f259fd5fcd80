"""Early stopping as the run directory records it (pure): the setting a job ran with (the
``run_start`` event's ``early_stop``) and the rung decisions (the ``rung`` events; ``rungs.jsonl``
holds the same records). `fleet status` and `fleet report` read them from here.

A decision names its ``model``, its ``rung`` (the epochs the model had trained there), its
``index`` (that rung's place among the model's rungs, from 0), its ``verdict`` (`VERDICTS`) and
``at`` (seconds since the run's start). Where a model has several decisions at one rung
(``paused``, then ``promoted`` or ``stopped``), the last is the one that stands.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import fields

from fleet.schedule.early_stop import EarlyStopError, EarlyStopSettings, Verdict, rung_epochs

VERDICTS = tuple(v.value for v in Verdict)  # continue, stopped, paused, promoted
RUNG_METHODS = ("asha", "sha", "hyperband")  # rungs at min_epochs x reduction^k; median decides at every epoch


def is_on(setting: Mapping | None) -> bool:
    """Whether an ``early_stop`` setting stops models (absent or method ``none``: no)."""
    return isinstance(setting, Mapping) and setting.get("method", "none") != "none"


def early_stop_setting(events: Iterable[Mapping]) -> dict:
    """The setting of the run's last job (``run_start``'s ``early_stop``); {} without early stopping."""
    setting: dict = {}
    for event in events:
        if event.get("event") == "run_start":
            found = event.get("early_stop")
            setting = dict(found) if is_on(found) else {}
    return setting


def rung_records(events: Iterable[Mapping]) -> list[dict]:
    """The ``rung`` events in log order, each decision once (a record read twice is one)."""
    seen: set[tuple] = set()
    records = []
    for event in events:
        if event.get("event") != "rung":
            continue
        key = (event.get("model"), event.get("rung"), event.get("verdict"), event.get("seq"))
        if key not in seen:
            seen.add(key)
            records.append(dict(event))
    return records


def has_early_stop(events: Iterable[Mapping]) -> bool:
    """Whether the run stops models early: its setting says so, or it recorded a rung decision."""
    events = list(events)
    return bool(early_stop_setting(events)) or bool(rung_records(events))


def planned_rungs(setting: Mapping) -> tuple[int, ...]:
    """The rungs' epochs the setting puts below ``max_epochs`` (every Hyperband bracket's lie
    among bracket 0's); () for ``median`` or a setting without the numbers."""
    if setting.get("method") not in RUNG_METHODS:
        return ()
    names = {f.name for f in fields(EarlyStopSettings)}
    try:
        checked = EarlyStopSettings(**{k: v for k, v in setting.items() if k in names})
    except (EarlyStopError, TypeError):  # a setting fleet would not run (hand-edited): rungs from records only
        return ()
    return rung_epochs(checked.min_epochs, checked.reduction, checked.max_epochs)


def rung_arrivals(records: Iterable[Mapping]) -> dict[int, list[float]]:
    """Per rung (epochs, ascending): when each model reached it (its first decision there's
    ``at``, seconds since the run's start), ascending; records without ``at`` are left out."""
    first: dict[int, dict[str, float]] = {}
    for record in records:
        rung, at = record.get("rung"), record.get("at")
        if isinstance(rung, int) and isinstance(at, (int, float)):
            first.setdefault(rung, {}).setdefault(str(record.get("model")), float(at))
    return {rung: sorted(first[rung].values()) for rung in sorted(first)}
