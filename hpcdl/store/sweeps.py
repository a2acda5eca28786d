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
Its report (summary table, CSV, curves) is hpcdl.lifecycle.sweep_report.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any, Optional

from hpcdl.host import is_running
from hpcdl.store.files import MANIFEST
from hpcdl.store.folders import DAMAGED, FINAL_STATES, JobRecord, load_record, read_json, remove_job_folder
from hpcdl.store.safety import UnsafeFolderError, check_job_key
from hpcdl.store.states import (CANCELLED, COMPLETED, FAILED, INTERRUPTED, LOST, NODE_FAIL, OUT_OF_MEMORY, PENDING,
                                RUNNING, STOPPED, SUBMITTING, TIMEOUT)

SWEEP = "sweep"
"""The manifest kind of a sweep's own folder."""
SUBMITTING_MARK = "submitting"
"""A sweep manifest's mark while a submission adds points: how many of the last ``points`` it adds."""
_WORST_FIRST = (FAILED, NODE_FAIL, OUT_OF_MEMORY, LOST, TIMEOUT, STOPPED, CANCELLED, DAMAGED)


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


def _batch_being_submitted(manifest: dict[str, Any]) -> list[str]:
    """The ids of the points whose submission the sweep's mark names (the last batch added): all of them when
    the mark makes no sense."""
    mark, points = manifest.get(SUBMITTING_MARK), manifest.get("points") or []
    if type(mark) is not int or not 0 <= mark <= len(points):
        return list(points)
    return list(points[len(points) - mark:])


def submission_state(sweep: JobRecord) -> Optional[str]:
    """SUBMITTING while a submission of the sweep's points is under way, INTERRUPTED once its submitter
    ended without finishing its first; None when the scheduler has every point listed, or when an earlier
    batch was handed over (the sweep's state is then its points': those of the cut batch never run)."""
    if SUBMITTING_MARK not in sweep.manifest:
        return None
    if _submitter_runs(sweep.manifest):
        return SUBMITTING
    return INTERRUPTED if len(_batch_being_submitted(sweep.manifest)) == len(sweep.manifest.get("points") or []) \
        else None


def handed_over(manifest: dict[str, Any], root: Path) -> Optional[bool]:
    """Whether a job of the store ``root`` may run: True once its scheduler id is recorded and the submission
    of its batch has ended (or it is no sweep's point), None while its submitter may still get there, False
    when the submitter ended first (an interrupted submission: none of that batch's points runs)."""
    sweep = manifest.get("sweep")
    if not isinstance(sweep, dict):
        return True
    if manifest.get("backend_id"):
        check_job_key(str(sweep.get("id")))
        sweep_manifest = read_json(root / str(sweep["id"]) / MANIFEST) or {}
        if SUBMITTING_MARK not in sweep_manifest or manifest.get("id") not in _batch_being_submitted(sweep_manifest):
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
        raise ValueError(f"{MANIFEST}: 'points' is not a list of job ids")
    for point in ids:
        check_job_key(point)
    return ids


def load_points(sweep: JobRecord, known: dict[str, JobRecord]) -> tuple[list[JobRecord], list[JobRecord]]:
    """The sweep's point records, taken from ``known`` or read from the store (each folder opened from one
    descriptor of the store); also those read here."""
    points, loaded = [], []
    ids = point_ids(sweep)
    store = os.open(sweep.folder.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for num, point in enumerate(ids):
            record = known.get(point)
            if record is None:
                why = "its folder is gone"
                try:
                    record = load_record(sweep.folder.parent / point, store)
                except (UnsafeFolderError, OSError) as e:
                    record, why = None, f"its folder cannot be trusted: {e}"
                if record is not None and record.state != DAMAGED and sweep_id_of(record) != sweep.id:
                    record, why = None, "its folder is no point of this sweep"
                if record is None:  # listed, but not readable as this sweep's point: counted, never trusted
                    record = JobRecord(sweep.folder.parent / point,
                                       {"id": point, "sweep": {"id": sweep.id, "num": num}}, {}, LOST, why)
                else:
                    loaded.append(record)
            points.append(record)
    finally:
        os.close(store)
    return points, loaded


def settle(sweep: JobRecord, points: list[JobRecord]) -> None:
    """Set the sweep's state from its points': open while any point is; else COMPLETED when all
    completed, or the worst final state among them. The reason counts the points by state."""
    counts = Counter(p.state for p in points)
    sweep.status = {**sweep.status, "counts": dict(counts), "points": len(points)}
    sweep.reason = ", ".join(f"{n} {state}" for state, n in sorted(counts.items(), key=lambda x: -x[1]))
    still_open = [s for s in counts if s not in FINAL_STATES and s != DAMAGED]
    if not points:
        sweep.state = SUBMITTING
    elif still_open:
        sweep.state = next((s for s in (RUNNING, SUBMITTING, PENDING) if s in counts), still_open[0])
    elif set(counts) == {COMPLETED}:
        sweep.state = COMPLETED
    else:
        sweep.state = next(s for s in _WORST_FIRST if s in counts)


def points_done(sweep: JobRecord) -> str:
    """'3 of 8 points done (5 RUNNING, 2 COMPLETED, 1 FAILED)', from the counts ``settle`` left in its status."""
    counts = sweep.status.get("counts") or {}
    done = sum(n for state, n in counts.items() if state in FINAL_STATES or state == DAMAGED)
    return f"{done} of {sweep.status.get('points', 0)} points done ({sweep.reason})"
