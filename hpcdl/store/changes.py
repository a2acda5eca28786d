"""Marks of the jobs whose state changed, for the store's index (hpcdl.store.index): one empty file per job, or
one file naming many jobs whose state changed together (INDEX_CHANGES: a sweep's points, cancelled at once).

The marks live in this user's index folder, ``.hpcdl-index-UID/`` in the store, beside the index's rows.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path
from typing import Optional

from hpcdl.errors import HpcdlError
from hpcdl.store.atomic import write_unsynced
from hpcdl.store.files import INDEX_CHANGES
from hpcdl.store.safety import open_own_folder

PREFIX = ".hpcdl-index-"
MARK = ".changed"
"""The suffix of a job's mark: ID.changed."""


def index_folder(root: Path) -> Path:
    """This user's index folder in the store ``root``."""
    return root / f"{PREFIX}{os.getuid()}"


def open_index(root: Path, create: bool) -> Optional[int]:
    """A descriptor of this user's index folder (made when ``create``), checked to be theirs alone."""
    return open_own_folder(index_folder(root), create)


def note_change(folder: Path) -> None:
    """Mark the job in ``folder`` as changed for its store's index; never fails its caller (a store this
    user may only read, or an index folder planted by another user, is read in full by the next listing)."""
    with contextlib.suppress(OSError, HpcdlError):
        fd = open_index(folder.parent, create=True)
        if fd is None:
            return
        try:
            os.close(os.open(folder.name + MARK, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                             dir_fd=fd))
        finally:
            os.close(fd)


def note_changes(root: Path, ids: list[str]) -> None:
    """Mark the jobs ``ids`` of the store ``root`` as changed with one file (INDEX_CHANGES, a new name for each
    call, so that concurrent writers lose none; not synced, as marks are not); never fails its caller."""
    if not ids:
        return
    with contextlib.suppress(OSError, HpcdlError):
        fd = open_index(root, create=True)
        if fd is None:
            return
        try:
            name = INDEX_CHANGES.format(token=secrets.token_hex(8))
            write_unsynced(index_folder(root) / name, "".join(f"{job}\n" for job in ids).encode(), fd)
        finally:
            os.close(fd)
