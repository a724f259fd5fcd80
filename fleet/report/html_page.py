"""``report.html``: one self-contained page (pure; no server, no network, no external file).

The PNGs are embedded as data URIs (each also links to its file beside the page, for a full-size
view); the leaderboard sorts by any column with a click (a few lines of inline script); every
text from the run is HTML-escaped.
"""

from __future__ import annotations

import base64
import html
import math
from collections.abc import Sequence
from dataclasses import dataclass

from fleet.report.group_results import GroupResult, group_ranks
from fleet.report.results import ModelResult, leaderboard_rows, model_end


@dataclass(frozen=True)
class Figure:
    caption: str
    file: str  # path relative to the page
    png: bytes


STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em auto; max-width: 1250px; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.15em; margin-top: 1.6em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; font-size: 0.88em; }
td, th { padding: 3px 9px; border-bottom: 1px solid #eee; text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
table.sortable th { cursor: pointer; background: #f4f4f4; } table.sortable th:hover { background: #e4e4ff; }
figure { margin: 1em 0; } figure img { max-width: 100%; border: 1px solid #eee; }
.note { color: #666; font-size: 0.85em; }
"""

SORT_SCRIPT = """
document.querySelectorAll('table.sortable').forEach(function (table) {
 table.querySelectorAll('th').forEach(function (th, column) {
  th.addEventListener('click', function () {
    var body = table.tBodies[0];
    var rows = Array.prototype.slice.call(body.rows);
    var up = th.dataset.order !== 'up';
    th.dataset.order = up ? 'up' : 'down';
    rows.sort(function (a, b) {
      var x = a.cells[column].dataset.key, y = b.cells[column].dataset.key;
      if (x === '' || y === '') { return (x === '') - (y === ''); }  // no value: last either way
      var nx = parseFloat(x), ny = parseFloat(y);
      var c = (isNaN(nx) || isNaN(ny)) ? x.localeCompare(y) : nx - ny;
      return up ? c : -c;
    });
    rows.forEach(function (row) { body.appendChild(row); });
  });
 });
});
"""

LEADERBOARD = ("rank", "model", "family", "metric", "best", "at epoch", "epochs", "end", "parameters", "GPU-s")


def _cell(value: object, numeric: bool = False, key: object = None) -> str:
    key = value if key is None else key
    css = ' class="num"' if numeric else ""
    return f'<td{css} data-key="{html.escape(str(key))}">{html.escape(str(value))}</td>'


def _number(value: float | None, digits: int = 4) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value:.{digits}f}"


def leaderboard_table(models: Sequence[ModelResult], groups: Sequence[GroupResult] = ()) -> str:
    """The sortable leaderboard, best first; with `groups` (learning over groups), ordered by
    group (the largest first) and within each by rank, with each model's group and its rank
    there (``rank`` stays its rank among all models)."""
    ranked = leaderboard_rows(list(models))
    rank = {m.id: k for k, m in enumerate(ranked, start=1)}
    keys = {m.id: g.key for g in groups for m in g.ranked}
    in_group = group_ranks(groups)
    headers = (*LEADERBOARD[:2], "group", "rank in group", *LEADERBOARD[2:]) if groups else LEADERBOARD
    rows = []
    for m in [m for g in groups for m in g.ranked] if groups else ranked:
        cells = [_cell(rank[m.id], True), _cell(m.id), _cell(m.family), _cell(m.metric),
                 _cell(_number(m.best_metric), True, "" if m.best_metric is None else m.best_metric),
                 _cell(m.best_epoch, True), _cell(m.epochs, True), _cell(model_end(m)), _cell(f"{m.parameters:,}", True, m.parameters),
                 _cell(f"{m.gpu_seconds:,.1f}", True, m.gpu_seconds)]
        if groups:
            cells[2:2] = [_cell(keys[m.id]), _cell(in_group[m.id], True)]
        rows.append("<tr>" + "".join(cells) + "</tr>")
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    return (f'<table id="leaderboard" class="sortable"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table>')


GROUPS = ("group", "samples", "validation samples", "ended", "best model", "configuration", "metric", "best",
          "at epoch")


def groups_table(groups: Sequence[GroupResult]) -> str:
    """One sortable row per group, the largest first: its size, its models ended, and its best
    model and configuration with the best metric and its epoch."""
    rows = []
    for g in groups:
        best = g.best
        size, val = ("-" if n is None else n for n in (g.samples, g.val_samples))
        cells = [_cell(g.key), _cell(size, True, "" if g.samples is None else g.samples),
                 _cell(val, True, "" if g.val_samples is None else g.val_samples),
                 _cell(f"{g.ended}/{len(g.ranked)}", False, g.ended / max(len(g.ranked), 1)),
                 _cell(best.id if best else "-"), _cell(g.best_configuration or "-"),
                 _cell(best.metric if best else "-"),
                 _cell(_number(best.best_metric) if best else "-", True, best.best_metric if best else ""),
                 _cell(best.best_epoch if best else "-", True, best.best_epoch if best else "")]
        rows.append("<tr>" + "".join(cells) + "</tr>")
    head = "".join(f"<th>{html.escape(h)}</th>" for h in GROUPS)
    return f'<table id="groups" class="sortable"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'


def key_values(rows: Sequence[tuple[str, str]]) -> str:
    body = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in rows)
    return f'<table class="summary">{body}</table>'


def table(headers: Sequence[str], rows: Sequence[Sequence[object]], numeric: Sequence[bool] = ()) -> str:
    """A plain table: `headers`, then `rows` (cells as text; a column marked in `numeric` right-aligned)."""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(_cell(c, k < len(numeric) and numeric[k]) for k, c in enumerate(row)) + "</tr>"
                   for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def figure(fig: Figure) -> str:
    data = base64.b64encode(fig.png).decode("ascii")
    caption = html.escape(fig.caption)
    return (f'<figure><a href="{html.escape(fig.file)}"><img src="data:image/png;base64,{data}" '
            f'alt="{caption}" data-file="{html.escape(fig.file)}"></a><figcaption>{caption} '
            f'<span class="note">({html.escape(fig.file)})</span></figcaption></figure>')


def page(title: str, sections: Sequence[tuple[str, str]], footnote: str = "") -> str:
    """The whole page: `sections` are (heading, inner HTML) in order."""
    body = "".join(f"<h2>{html.escape(h)}</h2>{inner}" for h, inner in sections)
    note = f'<p class="note">{html.escape(footnote)}</p>' if footnote else ""
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>{body}{note}"
            f"<script>{SORT_SCRIPT}</script></body></html>\n")
