"""What `jobs list` and `jobs clean` act on: the stores' index rows, filtered, with the jobs not ended asked of
their scheduler (one query per backend) and each row shown only once its folder confirms it.

Rows are filtered before records are made of them, so a listing of a few jobs out of 100,000 costs one
read of each store's index; other users' jobs (``--all``, ``--user``) are read from their folders as JSON
alone, never unpickled, and their state is what their owner last recorded (they are never settled here).
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import re
import secrets
import shutil
import stat
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Iterable, Optional

from hpcdl.errors import HpcdlError
from hpcdl.store.files import FINAL, MANIFEST, STATUS
from hpcdl.store.changes import note_change
from hpcdl.store.folders import DAMAGED, FINAL_STATES, JobRecord, known_roots, load_record
from hpcdl.store.index import (ID, KIND, NAME, STATE, SUBMITTED, SWEEP, UID, Row, confirmed, indexed_rows, is_open,
                               record_of)
from hpcdl.store.safety import check_store, unsafe_reason

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhdw])$")
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
FOREIGN_READ_LIMIT = 1 << 20
"""The most bytes read of another user's file (a manifest or state record)."""


def parse_duration(text: str) -> float:
    """Seconds in ``text``: a number and a unit, s m h d or w (``30d``, ``12h``); HpcdlError otherwise."""
    match = _DURATION.match(text.strip())
    if match is None:
        raise HpcdlError(f"{text!r} is not a duration: give a number and a unit, s, m, h, d or w (like 30d)")
    return float(match[1]) * _SECONDS[match[2]]


def parse_since(text: str, now: Optional[float] = None) -> float:
    """The time ``text`` names: a date or date and time (2026-12-01, 2026-12-01T09:30), or a duration ago (7d)."""
    with contextlib.suppress(ValueError):
        return datetime.fromisoformat(text.strip()).timestamp()
    try:
        return (time.time() if now is None else now) - parse_duration(text)
    except HpcdlError:
        raise HpcdlError(f"{text!r} is neither a date (2026-12-01, 2026-12-01T09:30) nor a duration ago "
                         "(a number and a unit, s, m, h, d or w: 7d)") from None


def user_id(name: str) -> int:
    """The uid of the user ``name`` (or a number); HpcdlError for no such user."""
    try:
        return pwd.getpwnam(name).pw_uid
    except KeyError:
        if name.isdigit():
            return int(name)
        raise HpcdlError(f"no user {name!r} on this host") from None


def user_name(uid: int) -> str:
    """The name of ``uid`` (the number where it has none)."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


@dataclass
class Selection:
    """The records a listing shows, oldest first, with each shown sweep's points and notes for stderr."""

    records: list[JobRecord] = field(default_factory=list)
    points: dict[str, list[JobRecord]] = field(default_factory=dict)
    owners: dict[str, str] = field(default_factory=dict)
    """The owner of each record shown, when other users' jobs were asked for (``--all``, ``--user``)."""
    skipped: list[str] = field(default_factory=list)


def _rows(roots: Optional[Iterable[Path]], skipped: list[str]) -> list[tuple[Path, Row]]:
    """(store, row) of every folder in the stores, oldest first; another user's folder in a store that is not
    shared is noted in ``skipped`` and left out."""
    found, me = [], os.getuid()
    roots = list(roots) if roots is not None else known_roots()
    for root in roots:
        shared = check_store(root)
        for row in indexed_rows(root, skipped):
            if row[UID] == me or shared:
                found.append((root, row))
                continue
            with contextlib.suppress(FileNotFoundError):
                skipped.append(f"{root / row[ID]}: {unsafe_reason(os.lstat(root / row[ID]), stat.S_IFDIR)}")
    if len(roots) == 1:  # each store's rows are in order already
        return found
    return sorted(found, key=lambda pair: 0 if pair[1][STATE] == DAMAGED else pair[1][SUBMITTED])


def _record(root: Path, row: Row) -> Optional[JobRecord]:
    """A job's record: from its row once ended, else read from its folder (its state is asked afresh); a
    sweep's from its folder always (whether its submission is under way is in its manifest alone)."""
    return load_record(root / row[ID]) if is_open(row) or row[KIND] == "sweep" else record_of(root, row)


def scan(roots: Optional[Iterable[Path]] = None, skipped: Optional[list[str]] = None) -> list[JobRecord]:
    """Every job of this user's in the stores, oldest first, without asking any scheduler (folders.scan)."""
    notes: list[str] = []
    records = [_record(root, row) for root, row in _rows(roots, notes) if row[UID] == os.getuid()]
    if skipped is not None:
        skipped += notes
    return [r for r in records if r is not None]


def select(roots: Optional[Iterable[Path]] = None, *, state: Optional[str] = None, name: Optional[str] = None,
           users: Optional[set[int]] = None, everyone: bool = False, since: Optional[float] = None,
           limit: int = 0, with_points: bool = False) -> Selection:
    """The jobs a listing shows: this user's (or those of ``users``, or ``everyone``'s), submitted since
    ``since``, whose name matches ``name`` (substring or glob) and whose state is ``state``; the newest
    ``limit``. A sweep's points are shown with it only when ``with_points``; its counts are of all of them."""
    import fnmatch

    from hpcdl.store.states import resolve_states
    from hpcdl.store.sweeps import point_ids

    selection, me = Selection(), os.getuid()
    users = {me} if users is None else users
    rows = [(root, row) for root, row in _rows(roots, selection.skipped)
            if (everyone or row[UID] in users) and (since is None or row[SUBMITTED] >= since)
            and (not name or fnmatch.fnmatch(row[NAME], name) or name in row[NAME])]
    mine = {row[ID]: (root, row) for root, row in rows if row[UID] == me}
    sweeps = {i for i, (_, row) in mine.items() if row[KIND] == "sweep"}
    in_sweep = {i for i, (_, row) in mine.items() if row[SWEEP] is not None and row[SWEEP].get("id") in sweeps}
    # asked afresh: the jobs not ended, the sweeps and their points (a sweep's state is its points')
    records = {i: _record(*mine[i]) for i in mine if is_open(mine[i][1]) or i in sweeps or i in in_sweep}
    known = {i: r for i, r in records.items() if r is not None}
    resolve_states(list(known.values()))
    for i, record in known.items():
        mine[i][1][STATE] = record.state
    if state:
        rows = [(root, row) for root, row in rows if row[STATE] == state.upper()]
    if not with_points:
        rows = [(root, row) for root, row in rows if row[ID] not in in_sweep]
    for root, row in rows[-limit:] if limit else rows:
        record = _shown(root, row, known, selection)
        if record is None:
            continue
        selection.records.append(record)
        if everyone or users != {os.getuid()}:
            selection.owners[record.id] = user_name(row[UID])
        if record.id in sweeps and record.state != DAMAGED:
            with contextlib.suppress(ValueError, HpcdlError):
                selection.points[record.id] = [known[p] for p in point_ids(record) if p in known]
    return selection


def _shown(root: Path, row: Row, known: dict[str, JobRecord], selection: Selection) -> Optional[JobRecord]:
    """The record of a row about to be shown, once its folder confirms the row (read again if it does not)."""
    if row[UID] != os.getuid():
        return foreign_record(root, row)
    if row[ID] in known:
        return known[row[ID]]
    fresh = confirmed(root, row, selection.skipped)
    if fresh is None:
        return None
    record = _record(root, fresh)
    if record is not None and is_open(fresh):
        from hpcdl.store.states import resolve_states

        resolve_states([record])
    return record


def _foreign_json(folder: int, name: str, owner: int) -> dict:
    """Another user's JSON file, opened without following a link, a regular file of the folder's owner, read
    up to FOREIGN_READ_LIMIT; {} when it is missing, unreadable or of another shape."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=folder)
    except OSError:
        return {}
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != owner:
            return {}
        try:
            value = json.loads(f.read(FOREIGN_READ_LIMIT + 1)[:FOREIGN_READ_LIMIT])
        except (OSError, ValueError):
            return {}
    return value if isinstance(value, dict) else {}


def foreign_record(root: Path, row: Row) -> JobRecord:
    """Another user's job as its owner last recorded it, read as JSON alone: PRIVATE when its folder is theirs
    alone (the default), DAMAGED when its record makes no sense; it is never settled, signalled or unpickled."""
    owner = user_name(row[UID])
    text = lambda value: value if isinstance(value, str) else "?"  # noqa: E731
    try:
        folder = os.open(root / row[ID], os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return JobRecord(root / row[ID], {"id": row[ID], "name": "?", "profile": "?"}, {}, "PRIVATE",
                         f"{owner}'s job, not shared with you", {})
    try:
        if os.fstat(folder).st_uid != row[UID]:
            manifest, status = {}, {}
        else:
            manifest, status = _foreign_json(folder, MANIFEST, row[UID]), _foreign_json(folder, STATUS, row[UID])
            status = {**status, **_foreign_json(folder, FINAL, row[UID])}
    finally:
        os.close(folder)
    state = status.get("state")
    state = state if isinstance(state, str) and state.isupper() and len(state) < 20 else "UNKNOWN"
    shown = {key: manifest[key] for key in ("backend_id",) if isinstance(manifest.get(key), str)}
    times = {key: status[key] for key in ("started_at", "ended_at") if isinstance(status.get(key), (int, float))}
    return JobRecord(root / row[ID], {"id": row[ID], "name": text(manifest.get("name")),
                                      "profile": text(manifest.get("profile")), **shown}, times, state,
                     f"as {owner} last recorded it", {})


def clean(older_than_s: float, state: Optional[str] = None, roots: Optional[Iterable[Path]] = None,
          dry_run: bool = False) -> list[JobRecord]:
    """Remove this user's jobs that ended more than ``older_than_s`` ago (in ``state`` when given); a sweep
    goes with its points, a point only with its sweep; never a job that has not ended, never a DAMAGED one,
    never another user's. Returns those removed (with ``dry_run``, those that would be)."""
    from hpcdl.store.sweeps import sweep_id_of

    selection = select(roots, state=state, with_points=True)
    cutoff = time.time() - older_than_s
    by_id = {r.id: r for r in selection.records}
    removed = []
    for record in selection.records:
        points = selection.points.get(record.id, [])
        if sweep_id_of(record) in by_id or record.state not in FINAL_STATES:
            continue  # a point goes with its sweep; a job not ended stays
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
