"""What a listing shows: the jobs of the stores' indexes that a filter selects, their states asked afresh; cleaning
up the jobs that ended long ago."""

from __future__ import annotations

import contextlib
import fnmatch
import os
import secrets
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional

from hpcdl.errors import HpcdlError
from hpcdl.lifecycle.states import resolve_states, resolve_sweep
from hpcdl.store.changes import note_change
from hpcdl.store.folders import DAMAGED, FINAL_STATES, JobRecord
from hpcdl.store.index import ID, KIND, NAME, STATE, SUBMITTED, SWEEP, UID, Row, confirmed, is_open
from hpcdl.store.listing import foreign_record, newest_first, open_indexes, row_record, user_name
from hpcdl.store.sweeps import point_ids, sweep_id_of


@dataclass
class Selection:
    """The records a listing shows, oldest first, with each shown sweep's points and notes for stderr."""

    records: list[JobRecord] = field(default_factory=list)
    points: dict[str, list[JobRecord]] = field(default_factory=dict)
    owners: dict[str, str] = field(default_factory=dict)
    """The owner of each record shown, when other users' jobs were asked for (``--all``, ``--user``)."""
    skipped: list[str] = field(default_factory=list)


def select(roots: Optional[Iterable[Path]] = None, *, state: Optional[str] = None, name: Optional[str] = None,
           users: Optional[set[int]] = None, everyone: bool = False, since: Optional[float] = None,
           limit: int = 0, with_points: bool = False) -> Selection:
    """The jobs a listing shows: this user's (or those of ``users``, or ``everyone``'s), submitted since
    ``since``, whose name matches ``name`` (substring or glob) and whose state is ``state``; the newest
    ``limit``. A sweep's points are shown with it only when ``with_points``; its counts are of all of them.

    Rows are taken newest first and only until ``limit`` are shown (hpcdl.store.listing.newest_first)."""
    selection, me = Selection(), os.getuid()
    users = {me} if users is None else users

    def wanted(row: Row) -> bool:
        return ((everyone or row[UID] in users) and (since is None or row[SUBMITTED] >= since)
                and (not name or fnmatch.fnmatch(row[NAME], name) or name in row[NAME]))

    indexes = open_indexes(roots, selection.skipped)
    try:
        at_hand = [(index.root, row) for index in indexes for row in index.rows if row[UID] == me and wanted(row)]
        sweeps = {row[ID] for _, row in at_hand if row[KIND] == "sweep"}
        # asked afresh: the jobs not ended, all at once; a sweep once it comes (its state is its points')
        known = {row[ID]: row_record(root, row) for root, row in at_hand if is_open(row)}
        known = {i: r for i, r in known.items() if r is not None}
        resolve_states(list(known.values()))
        for _, row in at_hand:
            if row[ID] in known:
                row[STATE] = known[row[ID]].state
        picked: list[tuple[Row, JobRecord]] = []
        for root, row in newest_first(indexes, selection.skipped, since):
            if not wanted(row):
                continue
            point = row[UID] == me and row[SWEEP] is not None and row[SWEEP].get("id") in sweeps
            if (point or row[ID] in sweeps) and not _asked(root, row, known) or point and not with_points:
                continue  # no job now, or a point of a sweep listed (newer than its sweep: known before it)
            if state and row[STATE] != state.upper():
                continue
            shown = _shown(root, row, known, selection)
            if shown is not None and not (state and shown.state != state.upper()):
                picked.append((row, shown))
                if len(picked) == limit:  # before the next row is asked for: it may be in another segment
                    break
    finally:
        for index in indexes:
            index.close()
    for row, record in reversed(picked):
        selection.records.append(record)
        if everyone or users != {me}:
            selection.owners[record.id] = user_name(row[UID])
        if record.id in sweeps and record.state != DAMAGED:
            with contextlib.suppress(ValueError, HpcdlError):
                selection.points[record.id] = [known[p] for p in point_ids(record) if p in known]
    return selection


def _asked(root: Path, row: Row, known: dict[str, JobRecord]) -> bool:
    """Put the record of a sweep or of one of its points into ``known`` (a sweep's state settled from its points
    known so far; those not known are read from the store), ``row``'s state set from it; False when its
    folder is no job now."""
    if row[ID] not in known:
        record = row_record(root, row)
        if record is None:
            return False
        known[row[ID]] = record
        if row[KIND] == "sweep" and record.state != DAMAGED:
            resolve_sweep(record, known)
    row[STATE] = known[row[ID]].state
    return True


def _shown(root: Path, row: Row, known: dict[str, JobRecord], selection: Selection) -> Optional[JobRecord]:
    """The record of a row about to be shown, once its folder confirms the row (read again if it does not)."""
    if row[UID] != os.getuid():
        return foreign_record(root, row)
    if row[ID] in known:
        return known[row[ID]]
    fresh = confirmed(root, row, selection.skipped)
    if fresh is None:
        return None
    record = row_record(root, fresh)
    if record is not None and is_open(fresh):
        resolve_states([record])
    return record


def clean(older_than_s: float, state: Optional[str] = None, roots: Optional[Iterable[Path]] = None,
          dry_run: bool = False) -> list[JobRecord]:
    """Remove this user's jobs that ended more than ``older_than_s`` ago (in ``state`` when given); a sweep
    goes with its points, a point only with its sweep; never a job that has not ended, never a DAMAGED one,
    never another user's. Returns those removed (with ``dry_run``, those that would be)."""
    selection = select(roots, state=state, with_points=True)
    cutoff = time.time() - older_than_s
    by_id = {r.id: r for r in selection.records}
    removed = []
    for record in selection.records:
        points = selection.points.get(record.id, [])
        sweep = sweep_id_of(record)
        if sweep in by_id or sweep is not None and (record.folder.parent / sweep).exists() \
                or record.state not in FINAL_STATES:
            continue  # a point goes with its sweep (never alone while its sweep is there); a job not ended stays
        ended = [p.status.get("ended_at") or p.manifest["submitted_at"] for p in (record, *points)]
        if any(p.state not in FINAL_STATES for p in points) or max(ended) > cutoff:
            continue
        if not dry_run:
            for job in (*points, record):
                _remove(job.folder)
        removed.append(record)
    return removed


def _remove(folder: Path) -> None:
    """Take ``folder`` out of the store at once (renamed to a hidden name), then delete it."""
    aside = folder.with_name(f".removing-{folder.name}-{secrets.token_hex(4)}")
    try:
        os.rename(folder, aside)
    except FileNotFoundError:
        return
    note_change(folder)
    shutil.rmtree(aside, ignore_errors=True)
