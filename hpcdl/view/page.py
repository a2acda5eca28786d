"""The experiment page: ONE self-contained HTML file (no server, no network: its script, style, curves as inline
SVG and the progress plot as a base64 PNG are all inside it). A sweep's page: the trial table (sortable by a click
on a header, filtered by a click on a state or by typing), each trial's curves and confusion matrix, the sweep's
definition and its best trial; a job's page: its progress plot, facts, each rank's log tail and the first error."""

from __future__ import annotations

import base64
import html
import math
import re
from typing import Any, Mapping, Optional, Sequence

Record = dict[str, Any]

CURVE_POINTS = 200
"""The most points of one curve in a trial's SVG (longer curves are thinned evenly)."""
LOWER_IS_BETTER = re.compile(r"loss|err|mse|mae|nll|perplexity|ppl|wer|cer|regret|cost|time")
"""Metric names whose best trial has the lowest value (loss, error, rmse, perplexity, word error rate, ...)."""
TABLE_COLUMNS = (("num", "#"), ("varying", "overrides that differ"), ("state", "state"), ("elapsed_s", "elapsed (s)"),
                 ("epoch", "epoch"), ("iteration", "iteration"), ("loss", "final loss"), ("accuracy", "final accuracy"),
                 ("validation_accuracy", "final val. accuracy"), ("best_validation_accuracy", "best val. accuracy"),
                 ("value", "value"), ("reason", "failure / reason"))

STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:1.6em}
table{border-collapse:collapse}td,th{border:1px solid #ddd;padding:3px 7px;text-align:left;vertical-align:top}
th{background:#f2f2f2;cursor:pointer;user-select:none;white-space:nowrap}th.asc:after{content:" \\25B2"}
th.desc:after{content:" \\25BC"}tr.best{background:#eef8ee}tr.hidden{display:none}
.state{cursor:pointer;padding:1px 6px;border-radius:3px;font-size:.9em}
.COMPLETED{background:#d8f0d8}.RUNNING{background:#d8e8f8}.PENDING,.SUBMITTING{background:#eee}
.FAILED,.NODE_FAIL,.OUT_OF_MEMORY,.LOST,.DAMAGED{background:#f8d8d8}.CANCELLED,.TIMEOUT,.STOPPED{background:#f8ecd0}
.trial{display:inline-block;vertical-align:top;margin:0 1.5em 1.5em 0;border:1px solid #ddd;padding:.6em}
pre{background:#f7f7f7;padding:.6em;overflow:auto;max-height:24em}
#filters button{margin-right:.4em}.confusion td{text-align:right;min-width:2em}
"""

SCRIPT = """
function cellValue(row, n){var c=row.cells[n];var v=c.getAttribute('data-v');
  if(v===null||v===''){return null}var f=parseFloat(v);return isNaN(f)?v.toLowerCase():f}
function sortBy(th){var table=th.closest('table');var n=th.cellIndex;var body=table.tBodies[0];
  var asc=!th.classList.contains('asc');
  Array.prototype.forEach.call(th.parentNode.cells,function(h){h.classList.remove('asc','desc')});
  th.classList.add(asc?'asc':'desc');
  var rows=Array.prototype.slice.call(body.rows);
  rows.sort(function(a,b){var x=cellValue(a,n),y=cellValue(b,n);
    if(x===null&&y===null){return 0}if(x===null){return 1}if(y===null){return -1}
    var d=(x<y)?-1:(x>y)?1:0;return asc?d:-d});
  rows.forEach(function(r){body.appendChild(r)})}
var stateFilter=null;
function applyFilters(){var text=document.getElementById('filter').value.toLowerCase();
  var shown=0;Array.prototype.forEach.call(document.querySelectorAll('#trials tbody tr'),function(r){
    var ok=(!stateFilter||r.getAttribute('data-state')===stateFilter)&&
      (!text||r.textContent.toLowerCase().indexOf(text)>=0);
    r.classList.toggle('hidden',!ok);if(ok){shown++}});
  document.getElementById('shown').textContent=shown+' shown'}
function filterState(state){stateFilter=(stateFilter===state)?null:state;
  document.getElementById('stateNow').textContent=stateFilter?('state: '+stateFilter):'';applyFilters()}
document.addEventListener('DOMContentLoaded',function(){if(!document.getElementById('trials')){return}
  Array.prototype.forEach.call(document.querySelectorAll('#trials th'),function(th){
    th.addEventListener('click',function(){sortBy(th)})});
  Array.prototype.forEach.call(document.querySelectorAll('.state'),function(s){
    s.addEventListener('click',function(e){e.preventDefault();filterState(s.getAttribute('data-state'))})});
  document.getElementById('filter').addEventListener('input',applyFilters);applyFilters()});
"""


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _cell(value: Any, key: str) -> str:
    if value is None:
        return ""
    if key in ("accuracy", "validation_accuracy", "best_validation_accuracy") and isinstance(value, (int, float)):
        return f"{100 * value:.2f}%"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _thin(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    if len(points) <= CURVE_POINTS:
        return list(points)
    step = len(points) / CURVE_POINTS
    return [points[int(i * step)] for i in range(CURVE_POINTS)] + [points[-1]]


def curve_svg(series: Sequence[tuple[str, str, Sequence[tuple[float, float]]]], title: str,
              width: int = 320, height: int = 160) -> str:
    """Lines (name, colour, (x, y) points) in one small inline SVG with its x and y ranges written at the edges."""
    drawn = [(name, color, [(x, y) for x, y in _thin(points) if math.isfinite(y)]) for name, color, points in series]
    drawn = [(name, color, points) for name, color, points in drawn if points]
    if not drawn:
        return ""
    xs = [x for _, _, p in drawn for x, _ in p]
    ys = [y for _, _, p in drawn for _, y in p]
    x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
    x1, y1 = (x1 if x1 > x0 else x0 + 1), (y1 if y1 > y0 else y0 + 1)
    left, top, w, h = 44, 18, width - 54, height - 38

    def at(x: float, y: float) -> str:
        return f"{left + w * (x - x0) / (x1 - x0):.1f},{top + h * (1 - (y - y0) / (y1 - y0)):.1f}"

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img">',
             f'<text x="{left}" y="12" font-size="11">{_e(title)}</text>',
             f'<rect x="{left}" y="{top}" width="{w}" height="{h}" fill="#fafafa" stroke="#999"/>',
             f'<text x="{left - 3}" y="{top + 8}" font-size="9" text-anchor="end">{y1:.3g}</text>',
             f'<text x="{left - 3}" y="{top + h}" font-size="9" text-anchor="end">{y0:.3g}</text>',
             f'<text x="{left}" y="{top + h + 12}" font-size="9">{x0:.0f}</text>',
             f'<text x="{left + w}" y="{top + h + 12}" font-size="9" text-anchor="end">{x1:.0f} iterations</text>']
    for n, (name, color, points) in enumerate(drawn):
        parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.4" '
                     f'points="{" ".join(at(x, y) for x, y in points)}"><title>{_e(name)}</title></polyline>')
        parts.append(f'<text x="{left + w - 4}" y="{top + 12 + 11 * n}" font-size="9" text-anchor="end" '
                     f'fill="{color}">{_e(name)}</text>')
    return "".join(parts) + "</svg>"


def trial_curves(iterations: Sequence[Record], validations: Sequence[Record]) -> str:
    """A trial's loss (training and validation) and accuracy, as inline SVGs."""
    def line(records: Sequence[Record], key: str, scale: float = 1.0) -> list[tuple[float, float]]:
        return [(r["iteration"], scale * r[key]) for r in records
                if isinstance(r.get(key), (int, float)) and isinstance(r.get("iteration"), (int, float))]

    loss = curve_svg([("training", "#D95319", line(iterations, "loss")),
                      ("validation", "#000000", line(validations, "loss"))], "loss")
    accuracy = curve_svg([("training", "#0072BD", line(iterations, "accuracy", 100)),
                          ("validation", "#000000", line(validations, "accuracy", 100))], "accuracy (%)")
    return loss + accuracy


def confusion_table(confusion: Optional[Mapping[str, Any]]) -> str:
    """A confusion matrix (rows: true class, columns: predicted) with each cell shaded by its row's share."""
    if not confusion:
        return ""
    classes, counts = confusion.get("classes") or [], confusion.get("counts") or []
    rows = []
    for name, row in zip(classes, counts):
        total = sum(row) or 1
        cells = "".join(f'<td style="background:rgba(0,114,189,{min(1.0, n / total):.2f})">{int(n)}</td>'
                        for n in row)
        rows.append(f"<tr><th>{_e(name)}</th>{cells}</tr>")
    head = "".join(f"<th>{_e(c)}</th>" for c in classes)
    return (f'<table class="confusion"><caption>confusion matrix on the validation data (rows: true, columns: '
            f'predicted)</caption><tr><th></th>{head}</tr>{"".join(rows)}</table>')


def _document(title: str, body: str) -> str:
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>'
            f'<style>{STYLE}</style><script>{SCRIPT}</script></head><body>{body}</body></html>\n')


def best_trial(rows: Sequence[Mapping[str, Any]], metric: str) -> Optional[Mapping[str, Any]]:
    """The row with the best ``metric``: the highest for an accuracy, a value or a reward, the lowest for a loss or
    an error (LOWER_IS_BETTER in its name)."""
    scored = [r for r in rows if isinstance(r.get(metric), (int, float)) and math.isfinite(r[metric])]
    if not scored:
        return None
    lowest = LOWER_IS_BETTER.search(metric.lower()) is not None
    return (min if lowest else max)(scored, key=lambda r: r[metric])


def sweep_page(title: str, facts: Sequence[tuple[str, str]], definition: str, rows: Sequence[Mapping[str, Any]],
               curves: Mapping[str, tuple[list[Record], list[Record]]],
               confusions: Mapping[str, Mapping[str, Any]], metric: str,
               own_metrics: Sequence[tuple[str, str]] = ()) -> str:
    """The page of a sweep: ``rows`` as the summary's (hpcdl.lifecycle.sweep_report), each trial's curves and
    confusion matrix by its id, ``definition`` (its multirun.yaml and command), the best trial by ``metric``;
    ``own_metrics``: (row key, name) of the metrics the points' own code reported, a column each."""
    best, named = best_trial(rows, metric), dict(own_metrics).get(metric, metric)
    columns = [*TABLE_COLUMNS[:-2], *own_metrics, *TABLE_COLUMNS[-2:]]  # before value and reason
    head = "".join(f'<th data-key="{_e(key)}">{_e(label)}</th>' for key, label in columns)
    body_rows = []
    for row in rows:
        cells = []
        for key, _ in columns:
            value = row.get(key)
            sort = "" if value is None else value if isinstance(value, (int, float)) else str(value)
            if key == "num":
                shown = f'<a href="#trial-{_e(row["num"])}">{_e(row["num"])}</a>'
            elif key == "state":
                shown = f'<span class="state {_e(value)}" data-state="{_e(value)}">{_e(value)}</span>'
            else:
                shown = _e(_cell(value, key))
            cells.append(f'<td data-v="{_e(sort)}">{shown}</td>')
        best_class = ' class="best"' if best is row else ""
        body_rows.append(f'<tr id="row-{_e(row["num"])}" data-state="{_e(row["state"])}"{best_class}>'
                         f'{"".join(cells)}</tr>')
    states = sorted({str(r["state"]) for r in rows})
    buttons = "".join(f'<button type="button" class="state {_e(s)}" data-state="{_e(s)}">{_e(s)} '
                      f'({sum(1 for r in rows if r["state"] == s)})</button>' for s in states)
    best_words = (f'trial <a href="#trial-{_e(best["num"])}">{_e(best["num"])}</a> ({_e(best.get("varying"))}): '
                  f'{_e(named)} {_e(_cell(best.get(metric), metric))}' if best else f"no trial has {_e(named)} yet")
    trials = []
    for row in rows:
        iterations, validations = curves.get(row["id"], ([], []))
        trials.append(f'<div class="trial" id="trial-{_e(row["num"])}"><b>trial {_e(row["num"])}</b> '
                      f'{_e(row.get("varying"))} <span class="state {_e(row["state"])}">{_e(row["state"])}</span>'
                      f'<br>{trial_curves(iterations, validations) or "no curves recorded"}'
                      f'{confusion_table(confusions.get(row["id"]))}'
                      f'{"<br>" + _e(row["reason"]) if row.get("reason") else ""}</div>')
    info = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in facts)
    body = (f"<h1>{_e(title)}</h1><table>{info}<tr><th>best by {_e(named)}</th><td>{best_words}</td></tr></table>"
            f'<h2>Trials</h2><div id="filters">filter: <input id="filter" placeholder="text in a row"> {buttons} '
            f'<span id="stateNow"></span> <span id="shown"></span></div>'
            f'<table id="trials"><thead><tr>{head}</tr></thead><tbody>{"".join(body_rows)}</tbody></table>'
            f'<h2>Each trial</h2>{"".join(trials)}<h2>Definition</h2><pre>{_e(definition)}</pre>')
    return _document(title, body)


def job_page(title: str, facts: Sequence[tuple[str, str]], plot_png: Optional[bytes], logs: Mapping[int, str],
             error: str, confusion: Optional[Mapping[str, Any]] = None) -> str:
    """The page of one job: its progress plot, ``facts``, the first error and each rank's log tail."""
    info = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in facts)
    plot = (f'<img alt="training progress" src="data:image/png;base64,{base64.b64encode(plot_png).decode()}">'
            if plot_png else "<p>no progress recorded yet</p>")
    tails = "".join(f"<h2>rank {rank}: last lines</h2><pre>{_e(text) or '(nothing written)'}</pre>"
                    for rank, text in sorted(logs.items()))
    body = (f"<h1>{_e(title)}</h1><table>{info}</table><h2>Training progress</h2>{plot}"
            f"{confusion_table(confusion)}"
            + (f'<h2>First error</h2><pre id="error">{_e(error)}</pre>' if error else "") + tails)
    return _document(title, body)
