"""The store's index: one row per job, so that a listing reads a few files rather than every job's folder.

Each user keeps their own in each store, ``.hpcdl-index-UID/`` (owner-only) beside the job folders: the
rows (in the files of hpcdl.store.segments) and an empty ``ID.changed`` mark per job whose state changed
since they were written (or one file naming many jobs that changed together: hpcdl.store.changes). Every write
of a job's state (manifest, status, final state and its withdrawal) marks its job; a mark is one file created
for that job (or that batch) alone, so concurrent writers lose none. Rows are
never trusted over the folders: each is plain JSON checked field by field (one that fails is read again
from its folder), and a row is shown only while its folder's modification time is the one it recorded
(otherwise the folder is read again). Folders of other users are recorded by owner alone (and the time their
name says, to stand among this user's jobs): their content is read, as JSON and never unpickled, only for
``jobs list --all`` and ``--user``.

This module makes and checks rows; hpcdl.store.segments keeps them on disk.
"""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path
from typing import Any, Optional

from hpcdl.store.folders import DAMAGED, FINAL_STATES, JobRecord, load_record
from hpcdl.store.changes import note_change
from hpcdl.store.safety import JOB_ID, JOB_KEY, UnsafeFolderError, unsafe_reason

_FIELDS = ("id", "mtime_ns", "uid", "state", "reason", "submitted_at", "name", "kind", "profile", "backend",
           "backend_id", "started_at", "ended_at", "fraction", "best_validation_accuracy", "sweep", "points")
(ID, MTIME, UID, STATE, REASON, SUBMITTED, NAME, KIND, PROFILE, BACKEND, BACKEND_ID, STARTED, ENDED, FRACTION,
 BEST, SWEEP, POINTS) = range(len(_FIELDS))
_NUMBER = (int, float)
_TYPES: tuple[tuple, ...] = ((str,), (int,), (int,), (str,), (str,), _NUMBER, (str,), (str,), (str,), (str,),
                             (str, type(None)), (*_NUMBER, type(None)), (*_NUMBER, type(None)),
                             (*_NUMBER, type(None)), (*_NUMBER, type(None)), (dict, type(None)), (list, type(None)))
_EXACT_TYPES = tuple(frozenset(kinds) for kinds in _TYPES)  # exact: a bool is no number here
Row = list
_ENDED = frozenset((*FINAL_STATES, DAMAGED))
_USER = os.getuid()  # a process's own uid does not change


def valid_row(row: Any) -> bool:
    """True for a row of the index's shape: every field of its type, the id a job key and no path."""
    return (type(row) is list and len(row) == len(_FIELDS)
            and all(map(frozenset.__contains__, _EXACT_TYPES, map(type, row)))
            and JOB_KEY.match(row[ID]) is not None
            and (row[POINTS] is None or all(isinstance(p, str) and JOB_KEY.match(p) for p in row[POINTS])))


def row_of(record: JobRecord, mtime_ns: int) -> Row:
    """The index row of a job read from its folder (its progress taken from the run's metrics summary)."""
    from hpcdl.store.metrics import progress

    view: dict[str, Any] = {}
    if record.state != DAMAGED and record.manifest.get("kind") != "sweep":
        try:
            view = progress(record)
        except (KeyError, TypeError, ValueError, AttributeError, OSError) as e:
            record.state, record.reason = DAMAGED, f"unexpected content: {type(e).__name__}: {e}"
    m, status = record.manifest, record.status

    def typed(value: Any, index: int) -> Any:  # times to the millisecond, accuracies to 1e-6: a shorter index
        if type(value) is float and index in (SUBMITTED, STARTED, ENDED, FRACTION, BEST):
            return round(value, 3 if index in (SUBMITTED, STARTED, ENDED) else 6)
        return value if type(value) in _EXACT_TYPES[index] else None

    row = [record.id, mtime_ns, os.getuid(), record.state, record.reason,
           typed(m.get("submitted_at"), SUBMITTED) or 0, typed(m.get("name"), NAME) or "?",
           typed(m.get("kind"), KIND) or "", typed(m.get("profile"), PROFILE) or "",
           typed(((m.get("plan") or {}).get("cluster") or {}).get("backend") if isinstance(m.get("plan"), dict)
                 and isinstance(m["plan"].get("cluster"), dict) else None, BACKEND) or "",
           typed(m.get("backend_id"), BACKEND_ID), typed(status.get("started_at"), STARTED),
           typed(status.get("ended_at"), ENDED), typed(view.get("fraction"), FRACTION),
           typed(view.get("best_validation_accuracy"), BEST), typed(m.get("sweep"), SWEEP),
           typed(m.get("points"), POINTS)]
    return row if valid_row(row) else [*row[:POINTS], None]


def foreign_row(name: str, info: os.stat_result) -> Row:
    """The row of another user's folder: its name, time and owner, nothing of its content. Its submission time
    is the one its name says (a job id, or a sweep's point's), else the folder's modification time: it stands
    among this user's jobs in a listing of the newest (``--all``, ``--user``), never before them all."""
    return [name, info.st_mtime_ns, info.st_uid, "", "", round(named_time(name) or info.st_mtime, 3), "", "", "",
            "", None, None, None, None, None, None, None]


def named_time(name: str) -> Optional[float]:
    """When the job ``name`` was submitted, as its id says (new_job_folder's YYMMDD-HHMMSS-xxxx, or a sweep's
    point's, ID_NUM); None for another name."""
    job = name.partition("_")[0]
    if not JOB_ID.match(job):
        return None
    try:
        return time.mktime(time.strptime(job[:13], "%y%m%d-%H%M%S"))
    except (ValueError, OverflowError):
        return None


def record_of(root: Path, row: Row) -> JobRecord:
    """A listing's record of an indexed job (the manifest and status fields a listing shows)."""
    manifest = {"id": row[ID], "name": row[NAME], "kind": row[KIND], "profile": row[PROFILE],
                "submitted_at": row[SUBMITTED], "backend_id": row[BACKEND_ID],
                "plan": {"cluster": {"backend": row[BACKEND]}}}
    if row[SWEEP] is not None:
        manifest["sweep"] = row[SWEEP]
    if row[POINTS] is not None:
        manifest["points"] = row[POINTS]
    status = {"started_at": row[STARTED], "ended_at": row[ENDED]}
    if row[STATE] not in FINAL_STATES and row[STATE] != DAMAGED:
        status["state"] = row[STATE]
    view = {key: row[index] for key, index in (("fraction", FRACTION), ("best_validation_accuracy", BEST))
            if row[index] is not None}
    return JobRecord(root / row[ID], manifest, status, row[STATE], row[REASON], view)


def is_open(row: Row) -> bool:
    """True for a job of this user's that has not ended (its state is asked again at every listing)."""
    return row[STATE] not in _ENDED and row[KIND] != "sweep" and row[UID] == _USER


def read_row(root: Path, name: str, skipped: Optional[list[str]]) -> Optional[Row]:
    """The row of ``root``/``name`` read from the folder; None for no job (and a note in ``skipped`` for a
    folder of this user's that is not theirs alone, or another user's in a store that is not shared)."""
    path = root / name
    try:
        info = os.lstat(path)
        if info.st_uid != os.getuid() and stat.S_ISDIR(info.st_mode):
            return foreign_row(name, info)
        reason = unsafe_reason(info, stat.S_IFDIR)
        record = None if reason else load_record(path)
    except FileNotFoundError:
        return None
    except UnsafeFolderError as e:  # swapped after the look above: still never trusted
        reason = str(e)
    if reason:
        if skipped is not None:
            skipped.append(f"{path}: {reason}")
        return None
    return None if record is None else row_of(record, info.st_mtime_ns)


def row_key(row: Row) -> tuple[float, str]:
    """Where a row stands in a listing, oldest first: its submission time (DAMAGED first), then its id."""
    return (0 if row[STATE] == DAMAGED else row[SUBMITTED], row[ID])


def confirmed(root: Path, row: Row, skipped: Optional[list[str]] = None) -> Optional[Row]:
    """``row`` while its folder's modification time is the one it recorded; else the folder read again
    (None when it is no job now)."""
    try:
        if os.lstat(root / row[ID]).st_mtime_ns == row[MTIME]:
            return row
    except FileNotFoundError:
        return None
    fresh = read_row(root, row[ID], skipped)
    if fresh is not None and fresh[UID] == os.getuid():
        note_change(root / row[ID])  # the next listing writes the fresh row
    return fresh
