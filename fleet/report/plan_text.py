"""A plan (plan.json's document) as text: `fleet plan` prints it, and `fleet profile`'s report."""

from __future__ import annotations

import math
from pathlib import Path

from fleet.report.table import format_duration, format_gpus, format_table


def render_plan(document: dict, rates, source: str, out: Path) -> str:
    """The plan as text: the header, then a table per round (also `fleet profile`'s report)."""
    gpn, total = document["gpus_per_node"], document["total_gpus"]
    said = {"profile": "the profile's 'epochs'", "max-epochs": "--max-epochs for every model",
            "profile + max-epochs": "the profile's 'epochs', --max-epochs where missing"}[source]
    lines = [
        f"policy {document['policy']} on {total} GPUs ({math.ceil(total / gpn)} nodes x {gpn}); "
        f"epochs from {said}",
        f"predicted makespan {format_duration(document['makespan_s'])} ({document['makespan_s']:,.0f} s), "
        f"{len(document['rounds'])} round(s), lower bound LB2 {document['lower_bound_s']:,.0f} s "
        f"(makespan/LB2 {document['makespan_s'] / document['lower_bound_s']:.2f})",
    ]
    for rnd in document["rounds"]:
        lines += ["", f"round {rnd['index']}: {format_duration(rnd['start'])} -> {format_duration(rnd['end'])}"]
        rows = [
            [m["model"], m["stream"], format_gpus(m["gpus"]), format_gpus(m["nodes"]),
             f"{rates.rate(m['model'], len(m['gpus'])):.1f}", format_duration(m["start"]),
             format_duration(m["end"]), m["outcome"]]
            for m in rnd["members"]
        ]
        lines.append(format_table(["model", "stream", "gpus", "nodes", "samples/s", "start", "end", "outcome"], rows))
    lines += ["", f"wrote {out}"]
    return "\n".join(lines)
