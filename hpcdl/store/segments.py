"""The files of a store's index (hpcdl.store.index): a head read at every listing, and the rows of ended jobs in
segments that a listing of the newest jobs reads only as far as it goes.

In this user's index folder ``.hpcdl-index-UID/``:

- ``head.jsonl``: line 1 what the index knows of the store (version, uid, whether the store is shared, the
  store folder's stamp when every folder was last seen, the folders that are no job yet, and each segment's
  file and key range); line 2 each segment's job ids; then the rows read again at every listing: jobs that
  have not ended, sweeps (their state is their points'), DAMAGED jobs, and other users' folders in a store
  that is not shared.
- ``ended-N.jsonl``: ended jobs' rows, oldest first (by ``row_key``), about SEGMENT to a file. A segment is
  never changed in place: a change writes new segments, then the head that names them, then removes the old.

A listing takes the index's lock, removes the marks it finds and reads those jobs' folders again, with
every job that has not ended; it lists the store folder only when the store folder's stamp (device, inode,
modification and change times) differs from the head's, to find folders added or removed behind the
index's back. A stamp is recorded only when it is older than the listing by STAMP_MARGIN_NS, so that a
folder made within the file system clock's tick of a listing is not missed. A segment's rows are checked
field by field when read: a row of an id the head does not list for it is ignored, a listed id without a
valid row is read from its folder (and marked, so that the next listing writes its row again).
"""

from __future__ import annotations

import bisect
import contextlib
import fcntl
import json
import os
import re
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional

from hpcdl.store.atomic import atomic_write_text
from hpcdl.store.changes import MARK, index_folder, note_change, open_index
from hpcdl.store.files import INDEX_CHANGES, INDEX_HEAD, INDEX_ROWS, INDEX_SEGMENT
from hpcdl.store.index import ID, KIND, STATE, UID, Row, is_open, read_row, row_key, valid_row
from hpcdl.store.safety import JOB_KEY, UnsafeFolderError, unsafe_reason
from hpcdl.store.states import DAMAGED

LOCK = "lock"
VERSION = 3
"""The index's format: an index of another version is written anew (3: other users' rows keyed by their time)."""
SEGMENT = 4000
"""Rows to a segment: the newest segment is filled up to it; another is split once it holds twice as many."""
STAMP_MARGIN_NS = 2_000_000_000
"""How much older than a listing the store folder's stamp must be to be recorded (clock ticks, NFS skew)."""
_SEGMENT_FILE = re.compile("^" + re.escape(INDEX_SEGMENT).replace(r"\{number\}", r"(\d+)") + "$")
_CHANGES_FILE = re.compile("^" + re.escape(INDEX_CHANGES).replace(r"\{token\}", r"[0-9a-f]+") + "$")


@dataclass
class Segment:
    """One segment file: its name, the keys of its first and last rows, the ids it holds and, once the index is
    brought up to date, its descriptor (the file as it was then, whatever later listings write)."""

    file: str
    low: float
    high: float
    ids: list[str]
    fd: Optional[int] = None


@dataclass
class Head:
    """What head.jsonl holds (see the module)."""

    shared: bool
    stamp: Optional[list[int]]
    pending: list[str]
    segments: list[Segment]
    rows: dict[str, Row]
    number: int
    """The number of the next segment file written."""
    damaged: bool = False
    """A row of the head failed its checks: its id is found again by listing the store."""


@dataclass
class StoreIndex:
    """One store's rows brought up to date with its folders: ``rows`` at hand (those read at every listing and
    those read again now), ``segments`` read on demand, skipping the ``stale`` ids (rows at hand or gone)."""

    root: Path
    shared: bool
    rows: list[Row]
    segments: list[Segment] = field(default_factory=list)
    stale: set[str] = field(default_factory=set)

    def segment_rows(self, segment: Segment, skipped: Optional[list[str]] = None) -> list[Row]:
        """The rows of ``segment`` that are current (see the module)."""
        rows, again = _segment_rows(self.root, segment, self.stale, skipped)
        for name in again:
            note_change(self.root / name)  # read from its folder: the next listing writes its row again
        return rows

    def close(self) -> None:
        for segment in self.segments:
            if segment.fd is not None:
                os.close(segment.fd)
                segment.fd = None


def _segment_rows(root: Path, segment: Segment, stale: set[str],
                  skipped: Optional[list[str]]) -> tuple[list[Row], list[str]]:
    """The valid rows of ``segment`` of the ids it lists and that are not ``stale``, and the ids among them whose
    row was missing or failed its checks: those are read from their folders."""
    wanted = set(segment.ids) - stale
    rows: list[Row] = []
    if segment.fd is not None:
        size = os.fstat(segment.fd).st_size
        header, _, body = os.pread(segment.fd, size, 0).partition(b"\n")
        try:
            if json.loads(header) == {"version": VERSION, "uid": os.getuid()}:
                rows = json.loads(b"[" + body.rstrip(b"\n").replace(b"\n", b",") + b"]")
        except ValueError:  # a damaged file: its jobs are read from their folders
            rows = []
    found = []
    for row in rows:
        if valid_row(row) and row[ID] in wanted:
            wanted.discard(row[ID])
            found.append(row)
    for name in sorted(wanted):
        row = read_row(root, name, skipped)
        if row is not None:
            found.append(row)
    return found, sorted(wanted)


def _read_file(fd: int, name: str) -> Optional[bytes]:
    try:
        file = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd)
    except OSError:
        return None
    with os.fdopen(file, "rb") as f:
        return None if unsafe_reason(os.fstat(f.fileno()), stat.S_IFREG) else f.read()


def _segment_fd(fd: int, name: str) -> Optional[int]:
    """A descriptor of the segment ``name``, a regular file of this user's alone; None otherwise."""
    try:
        file = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd)
    except OSError:
        return None
    if unsafe_reason(os.fstat(file), stat.S_IFREG):
        os.close(file)
        return None
    return file


def _is_stamp(value: Any) -> bool:
    return type(value) is list and len(value) == 4 and all(type(v) is int for v in value)


def read_head(fd: int) -> Optional[Head]:
    """The head of the index folder ``fd``; None when it is missing, of another version or user, or damaged."""
    data = _read_file(fd, INDEX_HEAD)
    if data is None:
        return None
    header, _, rest = data.partition(b"\n")
    ids, _, body = rest.partition(b"\n")
    try:
        h, ids = json.loads(header), json.loads(ids)
        rows = json.loads(b"[" + body.rstrip(b"\n").replace(b"\n", b",") + b"]")
    except ValueError:
        return None
    number = (lambda v: type(v) in (int, float))  # noqa: E731
    if not (type(h) is dict and h.get("version") == VERSION and h.get("uid") == os.getuid()
            and type(h.get("shared")) is bool and (h.get("stamp") is None or _is_stamp(h["stamp"]))
            and type(h.get("pending")) is list and all(type(p) is str and JOB_KEY.match(p) for p in h["pending"])
            and type(h.get("next")) is int and type(h.get("segments")) is list and type(ids) is list
            and len(ids) == len(h["segments"])
            and all(type(s) is list and len(s) == 3 and type(s[0]) is str and _SEGMENT_FILE.match(s[0])
                    and number(s[1]) and number(s[2]) for s in h["segments"])
            and all(type(i) is list and all(type(j) is str and JOB_KEY.match(j) for j in i) for i in ids)):
        return None
    segments = [Segment(file, low, high, list(i)) for (file, low, high), i in zip(h["segments"], ids)]
    valid = [row for row in rows if valid_row(row)]
    return Head(h["shared"], h["stamp"], h["pending"], segments, {row[ID]: row for row in valid}, h["next"],
                damaged=len(valid) < len(rows))


def in_head(row: Row, shared: bool) -> bool:
    """True for a row read at every listing (see the module)."""
    return row[UID] == os.getuid() and (is_open(row) or row[STATE] == DAMAGED or row[KIND] == "sweep") \
        or row[UID] != os.getuid() and not shared


def folder_names(root: Path) -> set[str]:
    """The names of the store's folders that may be jobs (no hidden ones)."""
    return {entry.name for entry in os.scandir(root)
            if not entry.name.startswith(".") and entry.is_dir(follow_symlinks=False)}


def store_stamp(root: Path) -> list[int]:
    info = os.stat(root)
    return [info.st_dev, info.st_ino, info.st_mtime_ns, info.st_ctime_ns]


def recordable(stamp: list[int], listed_at_ns: int) -> Optional[list[int]]:
    """``stamp`` when it is older than the listing that saw every folder by STAMP_MARGIN_NS, else None."""
    return stamp if max(stamp[2], stamp[3]) < listed_at_ns - STAMP_MARGIN_NS else None


def open_segments(fd: int, head: Head) -> list[str]:
    """Open every segment of ``head``; returns the ids of those that cannot be (their jobs are read again)."""
    lost: list[str] = []
    kept = []
    for segment in head.segments:
        segment.fd = _segment_fd(fd, segment.file)
        if segment.fd is None:
            lost += segment.ids
        else:
            kept.append(segment)
    head.segments = kept
    return lost


def write_index(fd: int, root: Path, head: Head, extra: list[Row], stale: set[str],
                skipped: Optional[list[str]]) -> None:
    """Write the index: ``head`` (its rows, stamp, pending folders) with the ended rows ``extra`` put into the
    segments of their keys, the ``stale`` ids taken out of the segments; old segment files are removed."""
    segments = sorted(head.segments, key=lambda s: s.low)
    highs = [s.high for s in segments]
    incoming: dict[int, list[Row]] = {}
    for row in extra:
        at = min(bisect.bisect_left(highs, row_key(row)[0]), len(segments))
        if at == len(segments) and segments and len(segments[-1].ids) < SEGMENT:
            at -= 1  # the newest segment is filled first
        incoming.setdefault(at, []).append(row)
    changed = set(incoming) | {n for n, s in enumerate(segments) if not stale.isdisjoint(s.ids)}
    kept: list[Segment] = []
    for n in range(len(segments) + 1):
        if n not in changed:
            if n < len(segments):
                kept.append(segments[n])
            continue
        rows = _segment_rows(root, segments[n], stale, skipped)[0] if n < len(segments) else []
        rows = sorted(rows + incoming.get(n, []), key=row_key)
        limit = SEGMENT if n >= len(segments) - 1 else 2 * SEGMENT
        chunks = [rows] if len(rows) <= limit else [rows[i:i + SEGMENT] for i in range(0, len(rows), SEGMENT)]
        for chunk in chunks if rows else ():
            name = INDEX_SEGMENT.format(number=head.number)
            head.number += 1
            lines = [json.dumps({"version": VERSION, "uid": os.getuid()})]
            lines += [json.dumps(row, separators=(",", ":")) for row in chunk]
            atomic_write_text(index_folder(root) / name, "\n".join(lines) + "\n")
            kept.append(Segment(name, row_key(chunk[0])[0], row_key(chunk[-1])[0], [row[ID] for row in chunk]))
    header = {"version": VERSION, "uid": os.getuid(), "shared": head.shared, "stamp": head.stamp,
              "pending": sorted(head.pending), "next": head.number,
              "segments": [[s.file, s.low, s.high] for s in kept]}
    lines = [json.dumps(header), json.dumps([s.ids for s in kept], separators=(",", ":"))]
    lines += [json.dumps(row, separators=(",", ":")) for row in sorted(head.rows.values(), key=row_key)]
    atomic_write_text(index_folder(root) / INDEX_HEAD, "\n".join(lines) + "\n")
    named = {s.file for s in kept}
    for entry in os.scandir(fd):
        if _SEGMENT_FILE.match(entry.name) and entry.name not in named or entry.name == INDEX_ROWS:
            os.unlink(entry.name, dir_fd=fd)


def _marks(fd: int) -> tuple[set[str], list[str]]:
    """The ids of the jobs marked changed in the index folder ``fd`` (each line of a file of many checked to be a
    job key), and the files that mark them."""
    files = [entry.name for entry in os.scandir(fd) if entry.name.endswith(MARK) or _CHANGES_FILE.match(entry.name)]
    ids = {name[:-len(MARK)] for name in files if name.endswith(MARK)}
    for name in files:
        if _CHANGES_FILE.match(name):
            ids.update((_read_file(fd, name) or b"").decode(errors="replace").splitlines())
    return {name for name in ids if JOB_KEY.match(name)}, files


@contextlib.contextmanager
def _locked(fd: Optional[int]) -> Iterator[bool]:
    """The index's lock held (True), or False where it cannot be taken (a store this user may only read)."""
    if fd is None:
        yield False
        return
    try:
        lock = os.open(LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=fd)
    except OSError:
        yield False
        return
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield True
    finally:
        os.close(lock)


def load_index(root: Path, shared: bool, skipped: Optional[list[str]] = None) -> StoreIndex:
    """The index of the store ``root`` brought up to date with its folders (see the module); close() it once
    read. A folder of this user's that is not theirs alone is left out and noted in ``skipped`` (path: why)."""
    try:
        fd = open_index(root, create=True)
    except OSError:  # a store this user may only read: an index there, or none
        fd = open_index(root, create=False)
    except UnsafeFolderError as e:
        if skipped is not None:
            skipped.append(f"{index_folder(root)}: {e}; every folder is read instead")
        fd = None
    try:
        with _locked(fd) as writable:
            return _refresh(root, fd, shared, writable, skipped)
    finally:
        if fd is not None:
            os.close(fd)


def _is_folder(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


def _refresh(root: Path, fd: Optional[int], shared: bool, writable: bool,
             skipped: Optional[list[str]]) -> StoreIndex:
    listed_at = time.time_ns()
    head = read_head(fd) if fd is not None else None
    head = head if head is not None and head.shared == shared else None
    again = set(open_segments(fd, head)) if fd is not None and head is not None else set()
    fresh, head = head is None, head or Head(shared, None, [], [], {}, 0)
    found, marks = _marks(fd) if fd is not None else (set(), [])
    stamp = store_stamp(root)
    names = folder_names(root) if fresh or head.damaged or head.stamp != stamp else None
    rows, extra, pending, gone = head.rows, {}, set(), set()
    for mark in marks:
        if writable:  # removed before its folders are read: a change made meanwhile marks it anew
            with contextlib.suppress(FileNotFoundError):
                os.unlink(mark, dir_fd=fd)
    again |= found | set(head.pending) | {name for name, row in rows.items() if is_open(row)}
    if names is not None:
        known = rows.keys() | set().union(*(s.ids for s in head.segments))
        again = (again | (names - known)) & names
        gone = known - names
    changed = bool(found) or bool(gone)
    for name in gone:
        rows.pop(name, None)
    for name in sorted(again):
        row, before = read_row(root, name, skipped), rows.get(name)
        if row is None:  # no job (yet), or a folder that is not this user's alone: noted each time
            if _is_folder(root / name):
                pending.add(name)
            changed = changed or rows.pop(name, None) is not None
            continue
        if row != before:  # a running job's progress alone is not worth rewriting the index
            changed = changed or before is None or before[STATE] != row[STATE] or not is_open(row)
        if in_head(row, shared):
            rows[name] = row
        else:
            rows.pop(name, None)
            extra[name] = row
    stale = gone | again | rows.keys()
    if names is not None:
        seen = recordable(stamp, listed_at)
        changed = changed or seen is not None and seen != head.stamp
        head.stamp = seen
    changed = changed or pending != set(head.pending)
    head.pending = sorted(pending)
    view = StoreIndex(root, shared, [*rows.values(), *extra.values()], list(head.segments), stale)
    if changed and writable and fd is not None:
        with contextlib.suppress(OSError):
            write_index(fd, root, head, list(extra.values()), stale, skipped)
    return view
