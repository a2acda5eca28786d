"""A sweep's report: one row per point (its overrides, state, metrics, a task's return value), as a table, a CSV
and the points' curves in one plot. Read from the points' own records: no torch."""

from __future__ import annotations

import csv
import math
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from hpcdl.store.files import FUNCTION_RESULT
from hpcdl.store.folders import DAMAGED, JobRecord
from hpcdl.store.metrics import progress, read_records
from hpcdl.store.safety import load_pickle
from hpcdl.store.states import COMPLETED

LEGEND_ROWS = 25
"""The most points named in one column of the curves' legend."""
SUMMARY_COLUMNS = ("num", "id", "overrides", "state", "elapsed_s", "epoch", "iteration", "loss", "accuracy",
                   "validation_accuracy", "best_validation_accuracy", "value", "reason")
USER_METRIC = "metric:"
"""The prefix of a row's key for a metric the user's own code reported by name (hpcdl.report(..., reward=r))."""


def user_metric_keys(rows: list[dict[str, Any]]) -> list[str]:
    """The row keys of the metrics some point's own code reported by name, sorted."""
    return sorted({key for row in rows for key in row if key.startswith(USER_METRIC)})


def varying_overrides(overrides: list[list[str]]) -> list[str]:
    """Each point's label: those of its overrides that not every point has, the same ('key=value' of all points
    alike is left out). Where none varies (a single point), its every override."""
    shared = set.intersection(*map(set, overrides)) if overrides else set()
    labels = [" ".join(o for o in point if o not in shared) for point in overrides]
    return labels if any(labels) else [" ".join(point) for point in overrides]


def _point_overrides(point: JobRecord) -> list[str]:
    return [str(o) for o in point.manifest["sweep"].get("overrides", [])]


def summary(points: list[JobRecord]) -> list[dict[str, Any]]:
    """One row per point: its overrides (and those that vary between points, for the table), state, time, last
    and best metrics, and a task's scalar return value."""
    rows = []
    points = sorted(points, key=_num)
    labels = varying_overrides([_point_overrides(p) for p in points])
    for point, label in zip(points, labels):
        try:
            view = progress(point) if point.state != DAMAGED else {}
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            point.state, point.reason, view = DAMAGED, f"unexpected content: {type(e).__name__}: {e}", {}
        started = point.status.get("started_at")
        ended = point.status.get("ended_at") or (None if point.final else time.time())
        rows.append({
            "num": _num(point), "id": point.id,
            "overrides": " ".join(_point_overrides(point)), "varying": label, "state": point.state,
            "elapsed_s": round(ended - started, 1) if all(isinstance(t, (int, float)) for t in (started, ended))
            else None,
            **{key: view.get(key) for key in ("epoch", "iteration", "loss", "accuracy", "validation_accuracy",
                                              "best_validation_accuracy")},
            "value": _scalar_return(point), "reason": point.reason.splitlines()[0] if point.reason else "",
            **{USER_METRIC + str(name): value for name, value in (view.get("metrics") or {}).items()
               if isinstance(value, (int, float)) and not isinstance(value, bool)},
        })
    return rows


def _num(point: JobRecord) -> int:
    num = point.manifest["sweep"].get("num")
    return num if isinstance(num, int) else -1


def _scalar_return(point: JobRecord) -> Any:
    """A Hydra task's return value when it is a number or a short string (what a sweeper optimises)."""
    if point.state != COMPLETED or point.manifest.get("kind") != "function":
        return None
    try:
        returned = load_pickle(point.folder, FUNCTION_RESULT)
        value = getattr(returned, "return_value", returned)  # a Hydra task's JobReturn: the value it holds
    except Exception:  # noqa: BLE001 - a result that cannot be read here is left out of the table
        return None
    return value if isinstance(value, (int, float)) or (isinstance(value, str) and len(value) < 40) else None


def format_table(rows: list[dict[str, Any]]) -> str:
    """The summary as an aligned text table; its OVERRIDES are those that vary between the points."""
    columns = [c for c in SUMMARY_COLUMNS if c not in ("id", "reason") and any(r[c] is not None for r in rows)]
    columns += user_metric_keys(rows)
    shown = [[_cell(row["varying"] if c == "overrides" else row.get(c)) for c in columns] for row in rows]
    names = [c.removeprefix(USER_METRIC) for c in columns]
    widths = [max([len(c)] + [len(r[i]) for r in shown]) for i, c in enumerate(names)]
    lines = ["  ".join(c.upper().ljust(w) for c, w in zip(names, widths)).rstrip()]
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in shown]
    failed = [f"point {row['num']} ({row['id']}) {row['state']}: {row['reason']}" for row in rows if row["reason"]]
    return "\n".join(lines + failed)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def write_csv(rows: list[dict[str, Any]], path: Path) -> None:
    """The summary as CSV, one row per point."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)  # no planted link
    with open(descriptor, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[*SUMMARY_COLUMNS, *user_metric_keys(rows)],
                                extrasaction="ignore")  # each point's every override
        writer.writeheader()
        writer.writerows(rows)


def plot_curves(points: list[JobRecord], path: Path) -> bool:
    """The points' training loss (and validation accuracy) against iteration in one PNG; False without curves."""
    figure = curves_figure(points)
    if figure is None:
        return False
    descriptor, temporary = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=path.suffix, dir=path.parent)
    with open(descriptor, "wb") as f:  # a fresh file of its own, renamed over the target (never through a link)
        figure.savefig(f, dpi=100, format="png", bbox_inches="tight")  # "tight": the legend beside the panels too
    os.replace(temporary, path)
    return True


def curves_figure(points: list[JobRecord]) -> Any:
    """The figure of ``plot_curves`` (a matplotlib Figure), or None when no point has curves. Its legend, outside
    the panels, names each point by the overrides that vary between points."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    curves = [(p, read_records(p)) for p in points if p.state != DAMAGED]
    curves = [(p, records) for p, records in curves if any(r.get("kind") == "iteration" for r in records)]
    if not curves:
        return None
    with_validation = any(r.get("kind") == "validation" and r.get("accuracy") is not None
                          for _, records in curves for r in records)
    figure = Figure(figsize=(12 if with_validation else 7, 4.5))
    FigureCanvasAgg(figure)
    axes = figure.subplots(1, 2 if with_validation else 1, squeeze=False)[0]
    labels = varying_overrides([_point_overrides(p) for p in points])  # of all points: the same as the table's
    label_of = {p.id: label or p.id for p, label in zip(points, labels)}
    for point, records in curves:
        steps = [r for r in records if r.get("kind") == "iteration"]
        axes[0].plot([r["iteration"] for r in steps], [r["loss"] for r in steps], label=label_of[point.id])
        if with_validation:
            checks = [r for r in records if r.get("kind") == "validation" and r.get("accuracy") is not None]
            axes[1].plot([r["iteration"] for r in checks], [r["accuracy"] for r in checks], marker="o",
                         label=label_of[point.id])
    axes[0].set(xlabel="iteration", ylabel="training loss", title="Loss of each point")
    if with_validation:
        axes[1].set(xlabel="iteration", ylabel="validation accuracy", title="Validation accuracy")
    figure.tight_layout()
    handles, labels = axes[0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="upper left", bbox_to_anchor=(1, 0.93), fontsize="small",
                  ncols=math.ceil(len(labels) / LEGEND_ROWS))  # a long sweep's legend in columns, not a tower
    return figure
