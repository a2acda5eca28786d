"""Sweeps in the store: a sweep's folder lists its points, each an ordinary job; its state is theirs, summed up.

A sweep's manifest (kind ``sweep``) names its points (``points``: job ids in the
same store, ``<sweep id>_<num>``) and how they were handed to the scheduler
(``backend_id``: the Slurm array ids, comma-separated, or the local runner's
process). Each point's manifest names its sweep (``sweep``: id, num, overrides).
A submission names its points in the sweep's manifest before it writes them,
marked ``submitting`` until the scheduler has them all; a point runs only once
its own manifest has its scheduler id. A submitter that ended with the mark
still there left the sweep INTERRUPTED: none of its points runs, and
``jobs cancel`` (or ``jobs clean``) removes it.
Readers import no torch: the summary, its CSV and the comparison plot come from
the points' own records.
"""

from __future__ import annotations

import csv
import os
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any, Optional

from hpcdl.host import is_running
from hpcdl.store.files import FUNCTION_RESULT, MANIFEST
from hpcdl.store.folders import DAMAGED, FINAL_STATES, JobRecord, load_record, read_json, remove_job_folder
from hpcdl.store.safety import UnsafeFolderError, check_job_key, load_pickle

SWEEP = "sweep"
"""The manifest kind of a sweep's own folder."""
CANCELLED_MARK = "cancelled"
"""A file in a sweep's folder once it was cancelled: later batches of its sweeper are refused."""
SUBMITTING = "submitting"
"""A sweep manifest's mark while a submission adds points: how many of the last ``points`` it adds."""
INTERRUPTED = "INTERRUPTED"
"""The state of a sweep (and its points) whose submitter ended before the scheduler had them all."""
SUMMARY_CSV = "sweep-summary.csv"
SUMMARY_PLOT = "sweep-curves.png"
SUMMARY_COLUMNS = ("num", "id", "overrides", "state", "elapsed_s", "epoch", "iteration", "loss", "accuracy",
                   "validation_accuracy", "best_validation_accuracy", "value", "reason")
_WORST_FIRST = ("FAILED", "NODE_FAIL", "OUT_OF_MEMORY", "LOST", "TIMEOUT", "STOPPED", "CANCELLED", DAMAGED)


def is_sweep(record: JobRecord) -> bool:
    """True for a sweep's own folder."""
    return record.manifest.get("kind") == SWEEP


def sweep_id_of(record: JobRecord) -> Optional[str]:
    """The id of the sweep a job is a point of, or None."""
    sweep = record.manifest.get("sweep")
    return sweep.get("id") if isinstance(sweep, dict) and isinstance(sweep.get("id"), str) else None


def runs_under_runner(record: JobRecord) -> bool:
    """True for a point that hpcdl's sweep runner starts and ends (local sweeps, packed Slurm tasks)."""
    sweep = record.manifest.get("sweep")
    return isinstance(sweep, dict) and bool(sweep.get("runner"))


def _submitter_runs(manifest: dict[str, Any]) -> bool:
    submitter = (manifest.get("submitted_from") or {}).get("process")
    return submitter is None or is_running(submitter) is not False


def submission_state(sweep: JobRecord) -> Optional[str]:
    """SUBMITTING while a submission of the sweep's points is under way, INTERRUPTED once its submitter
    ended without finishing it; None when the scheduler has every point listed."""
    if SUBMITTING not in sweep.manifest:
        return None
    return "SUBMITTING" if _submitter_runs(sweep.manifest) else INTERRUPTED


def handed_over(manifest: dict[str, Any], root: Path) -> Optional[bool]:
    """Whether a job of the store ``root`` may run: True once its scheduler id is recorded and its sweep's
    submission has ended (or it is no sweep's point), None while its submitter may still get there, False
    when the submitter ended first (an interrupted submission: none of the sweep's points runs)."""
    sweep = manifest.get("sweep")
    if not isinstance(sweep, dict):
        return True
    if manifest.get("backend_id"):
        check_job_key(str(sweep.get("id")))
        sweep_manifest = read_json(root / str(sweep["id"]) / MANIFEST) or {}
        if SUBMITTING not in sweep_manifest:
            return True
    return None if _submitter_runs(manifest) else False


def remove_interrupted(sweep: JobRecord) -> None:
    """Remove an INTERRUPTED sweep from the store: its points' folders first, then its own (so that, cut short
    itself, it leaves a sweep that still names what remains)."""
    for point in point_ids(sweep):
        remove_job_folder(sweep.folder.parent / point)
    remove_job_folder(sweep.folder)


def point_ids(sweep: JobRecord) -> list[str]:
    """The ids of a sweep's points, each checked to name a job of the same store (never a path)."""
    ids = sweep.manifest.get("points", [])
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise ValueError("manifest.json: 'points' is not a list of job ids")
    for point in ids:
        check_job_key(point)
    return ids


def load_points(sweep: JobRecord, known: dict[str, JobRecord]) -> tuple[list[JobRecord], list[JobRecord]]:
    """The sweep's point records, taken from ``known`` or read from the store; also those read here."""
    points, loaded = [], []
    for num, point in enumerate(point_ids(sweep)):
        record = known.get(point)
        if record is None:
            why = "its folder is gone"
            try:
                record = load_record(sweep.folder.parent / point)
            except (UnsafeFolderError, OSError) as e:
                record, why = None, f"its folder cannot be trusted: {e}"
            if record is not None and record.state != DAMAGED and sweep_id_of(record) != sweep.id:
                record, why = None, "its folder is no point of this sweep"
            if record is None:  # listed, but not readable as this sweep's point: counted, never trusted
                record = JobRecord(sweep.folder.parent / point, {"id": point, "sweep": {"id": sweep.id, "num": num}},
                                   {}, "LOST", why)
            else:
                loaded.append(record)
        points.append(record)
    return points, loaded


def settle(sweep: JobRecord, points: list[JobRecord]) -> None:
    """Set the sweep's state from its points': open while any point is; else COMPLETED when all
    completed, or the worst final state among them. The reason counts the points by state."""
    counts = Counter(p.state for p in points)
    sweep.status = {**sweep.status, "counts": dict(counts), "points": len(points)}
    sweep.reason = ", ".join(f"{n} {state}" for state, n in sorted(counts.items(), key=lambda x: -x[1]))
    still_open = [s for s in counts if s not in FINAL_STATES and s != DAMAGED]
    if not points:
        sweep.state = "SUBMITTING"
    elif still_open:
        sweep.state = next((s for s in ("RUNNING", "SUBMITTING", "PENDING") if s in counts), still_open[0])
    elif set(counts) == {"COMPLETED"}:
        sweep.state = "COMPLETED"
    else:
        sweep.state = next(s for s in _WORST_FIRST if s in counts)


def points_done(sweep: JobRecord) -> str:
    """'3 of 8 points done (5 RUNNING, 2 COMPLETED, 1 FAILED)', from the counts ``settle`` left in its status."""
    counts = sweep.status.get("counts") or {}
    done = sum(n for state, n in counts.items() if state in FINAL_STATES or state == DAMAGED)
    return f"{done} of {sweep.status.get('points', 0)} points done ({sweep.reason})"


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
    from hpcdl.store.follow import progress

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
        })
    return rows


def _num(point: JobRecord) -> int:
    num = point.manifest["sweep"].get("num")
    return num if isinstance(num, int) else -1


def _scalar_return(point: JobRecord) -> Any:
    """A Hydra task's return value when it is a number or a short string (what a sweeper optimises)."""
    if point.state != "COMPLETED" or point.manifest.get("kind") != "function":
        return None
    try:
        returned = load_pickle(point.folder, FUNCTION_RESULT)
    except Exception:  # noqa: BLE001 - a result that cannot be read here is left out of the table
        return None
    value = getattr(returned, "_return_value", returned)
    return value if isinstance(value, (int, float)) or (isinstance(value, str) and len(value) < 40) else None


def format_table(rows: list[dict[str, Any]]) -> str:
    """The summary as an aligned text table; its OVERRIDES are those that vary between the points."""
    columns = [c for c in SUMMARY_COLUMNS if c not in ("id", "reason") and any(r[c] is not None for r in rows)]
    shown = [[_cell(row["varying"] if c == "overrides" else row[c]) for c in columns] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in shown]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.upper().ljust(w) for c, w in zip(columns, widths)).rstrip()]
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
        writer = csv.DictWriter(f, fieldnames=SUMMARY_COLUMNS, extrasaction="ignore")  # each point's every override
        writer.writeheader()
        writer.writerows(rows)


def plot_curves(points: list[JobRecord], path: Path) -> bool:
    """The points' training loss (and validation accuracy) against iteration in one PNG; False without curves."""
    figure = curves_figure(points)
    if figure is None:
        return False
    descriptor, temporary = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=".png", dir=path.parent)
    with open(descriptor, "wb") as f:  # a fresh file of its own, renamed over the target (never through a link)
        figure.savefig(f, dpi=100, format="png", bbox_inches="tight")  # "tight": the legend beside the panels too
    os.replace(temporary, path)
    return True


def curves_figure(points: list[JobRecord]) -> Any:
    """The figure of ``plot_curves`` (a matplotlib Figure), or None when no point has curves. Its legend, outside
    the panels, names each point by the overrides that vary between points."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from hpcdl.store.follow import read_records

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
    figure.legend(*axes[0].get_legend_handles_labels(), loc="upper left", bbox_to_anchor=(1, 0.93),
                  fontsize="small")
    return figure
