"""The stores' index rows as records, read without asking any scheduler (hpcdl.lifecycle.listing filters them
and asks the scheduler of the jobs not ended: `jobs list`, `jobs clean`).

Rows come newest first, and records are made only of those a listing shows, so a listing of the newest few
jobs out of 100,000 reads each store's index head and its newest segment; other users' jobs (``--all``,
``--user``) are read from their folders as JSON alone, never unpickled, and their state is what their owner
last recorded (they are never settled here).
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import re
import stat
import time
from datetime import datetime
from pathlib import Path
from typing import Iterable, Iterator, Optional

from hpcdl.errors import HpcdlError
from hpcdl.store.files import FINAL, MANIFEST, STATUS
from hpcdl.store.folders import JobRecord, known_roots, load_record
from hpcdl.store.index import ID, KIND, UID, Row, is_open, record_of, row_key
from hpcdl.store.safety import check_job_key, check_store, unsafe_reason
from hpcdl.store.segments import StoreIndex, load_index
from hpcdl.store.states import PRIVATE, UNKNOWN

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


def open_indexes(roots: Optional[Iterable[Path]], skipped: list[str]) -> list[StoreIndex]:
    """The stores' indexes, each brought up to date with its folders (close them once read); another user's
    folder in a store that is not shared is noted in ``skipped`` (newest_first leaves it out)."""
    indexes: list[StoreIndex] = []
    try:
        for root in list(roots) if roots is not None else known_roots():
            index = load_index(root, check_store(root), skipped)
            indexes.append(index)
            for row in index.rows if not index.shared else ():
                if row[UID] != os.getuid():
                    with contextlib.suppress(FileNotFoundError):
                        skipped.append(f"{root / row[ID]}: {unsafe_reason(os.lstat(root / row[ID]), stat.S_IFDIR)}")
    except BaseException:
        for index in indexes:
            index.close()
        raise
    return indexes


def newest_first(indexes: list[StoreIndex], skipped: list[str], floor: Optional[float] = None
                 ) -> Iterator[tuple[Path, Row]]:
    """(store, row) of every job of the stores, newest first (row_key); a segment is read only once its rows
    come next, none whose rows were all submitted before ``floor`` (its rows would be filtered out)."""
    me = os.getuid()
    order = lambda entry: (entry[0], entry[1])  # noqa: E731
    pending = sorted(((row_key(row), n, row) for n, index in enumerate(indexes) for row in index.rows), key=order)
    segments = sorted(((s.high, n, s) for n, index in enumerate(indexes) for s in index.segments), key=order)
    seen: list[set[str]] = [set() for _ in indexes]
    while True:
        while segments and (not pending or segments[-1][0] >= pending[-1][0][0]):
            high, n, segment = segments.pop()
            if floor is not None and high < floor:
                segments.clear()
                break
            pending += [(row_key(row), n, row) for row in indexes[n].segment_rows(segment, skipped)]
            pending.sort(key=order)
        if not pending:
            return
        _, n, row = pending.pop()
        if row[ID] in seen[n] or row[UID] != me and not indexes[n].shared:
            continue
        seen[n].add(row[ID])
        yield indexes[n].root, row


def row_record(root: Path, row: Row) -> Optional[JobRecord]:
    """A job's record: from its row once ended, else read from its folder (its state is asked afresh); a
    sweep's from its folder always (whether its submission is under way is in its manifest alone)."""
    return load_record(root / row[ID]) if is_open(row) or row[KIND] == "sweep" else record_of(root, row)


def scan(roots: Optional[Iterable[Path]] = None, skipped: Optional[list[str]] = None) -> list[JobRecord]:
    """Every job of this user's in the stores, oldest first, from each store's index, without asking any
    scheduler (those not ended are read from their folders).

    Folders that are not this user's alone are never read; each is noted in ``skipped`` (path: why), but for
    other users' folders in a shared store.
    """
    notes: list[str] = []
    indexes = open_indexes(roots, notes)
    try:
        rows = [(root, row) for root, row in newest_first(indexes, notes) if row[UID] == os.getuid()]
    finally:
        for index in indexes:
            index.close()
    if skipped is not None:
        skipped += notes
    records = [row_record(root, row) for root, row in reversed(rows)]
    return [r for r in records if r is not None]


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
        return JobRecord(root / row[ID], {"id": row[ID], "name": "?", "profile": "?"}, {}, PRIVATE,
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
    state = state if isinstance(state, str) and state.isupper() and len(state) < 20 else UNKNOWN
    shown = {key: manifest[key] for key in ("backend_id",) if isinstance(manifest.get(key), str)}
    times = {key: status[key] for key in ("started_at", "ended_at") if isinstance(status.get(key), (int, float))}
    return JobRecord(root / row[ID], {"id": row[ID], "name": text(manifest.get("name")),
                                      "profile": text(manifest.get("profile")), **shown}, times, state,
                     f"as {owner} last recorded it", {})


def find(key: str, roots: Optional[Iterable[Path]] = None) -> JobRecord:
    """The job whose id, unique id prefix or scheduler job id is ``key`` ('last': the newest)."""
    check_job_key(key)
    roots = list(roots) if roots is not None else known_roots()
    for root in roots:  # the exact id is a folder name: no scan needed
        check_store(root)
        record = load_record(root / key) if (root / key).is_dir() else None
        if record is not None:
            return record
    records = scan(roots)
    if key == "last" and records:
        return load_record(records[-1].folder) or records[-1]
    matches = [r for r in records if r.id.startswith(key) or r.backend_id == key]
    if len(matches) == 1:
        return load_record(matches[0].folder) or matches[0]
    if not matches:
        raise HpcdlError(f"no job {key!r} in {', '.join(map(str, roots)) or 'any store'}")
    raise HpcdlError(f"{key!r} matches {len(matches)} jobs: {', '.join(r.id for r in matches[:5])} ...")
