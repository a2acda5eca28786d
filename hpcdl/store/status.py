"""A job's own word on its state: status.json while it runs, final.json once it has ended.

status.json has one writer, the job's lead rank (RUNNING, with its host, pid and
start time). final.json holds the final state (COMPLETED, FAILED, TIMEOUT,
CANCELLED, ...) and is created once: of the ranks, the launcher, a cancel and a
listing that each may end a job, the first wins, and a rank that outlived a time
limit cannot turn TIMEOUT into COMPLETED.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from hpcdl.errors import FolderGoneError
from hpcdl.store.atomic import create_once, link_once, nameless_file, sync_filesystem
from hpcdl.store.changes import note_change, note_changes
from hpcdl.store.files import FINAL, RANK_RESULTS, RANKS_DONE, STATUS
from hpcdl.store.folders import read_json, write_json
from hpcdl.store.safety import UnsafeFolderError, open_folder


def write_status(folder: Path, state: str, **fields: Any) -> None:
    """Record the running job's state (the lead rank's alone; fields of earlier writes are kept)."""
    status = read_json(folder / STATUS) or {}
    status.update(fields, state=state, updated_at=time.time())
    write_json(folder / STATUS, status)


def _final_text(state: str, fields: dict[str, Any]) -> str:
    final = {**fields, "state": state, "ended_at": fields.get("ended_at", time.time())}
    return json.dumps(final, indent=1, sort_keys=True) + "\n"


def write_final(folder: Path, state: str, **fields: Any) -> bool:
    """Record the job's final state unless one is recorded already; True when this call's state holds."""
    won = create_once(folder / FINAL, _final_text(state, fields))
    if won:
        note_change(folder)
    return won


def write_finals(root: Path, ids: list[str], state: str, **fields: Any) -> list[str]:
    """Record the final state of many jobs of the store ``root`` at once (a sweep's points, cancelled together):
    ``state`` for each that has none recorded yet; returns the ids whose state this call recorded.

    Each folder is opened from one descriptor of the store, never through a link, and written only when it is
    this user's alone (one that is not, or is gone, is left as it is). Their final.json is one file, written
    once and linked into each folder (never changed in place: a withdrawal removes one folder's name), where
    the file system allows; one sync makes them durable, and one mark tells the store's index.
    """
    text, won = _final_text(state, fields), []
    store = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    shared = nameless_file(root, text.encode())
    try:
        for job in ids:
            try:
                folder = open_folder(root / job, store)
            except (FileNotFoundError, UnsafeFolderError):
                continue
            try:
                done = None if shared is None else link_once(shared, FINAL, folder)
                if done is None and shared is not None:  # as many links as the file system allows: a new file
                    os.close(shared)
                    shared = nameless_file(root, text.encode())
                    done = None if shared is None else link_once(shared, FINAL, folder)
                if done is None:
                    done = create_once(root / job / FINAL, text, durable=False, folder_fd=folder)
                if done:
                    won.append(job)
            except (FileNotFoundError, FolderGoneError):
                continue  # removed meanwhile: nothing to record, and the others are still cancelled
            finally:
                os.close(folder)
    finally:
        os.close(store)
        if shared is not None:
            os.close(shared)
        note_changes(root, won)
    sync_filesystem(root)
    return won


def forget_ranks_of_last_run(folder: Path) -> None:
    """Remove the ranks' done marks and results of an earlier run, which must not complete this run's set."""
    for stale in (RANKS_DONE, RANK_RESULTS):
        shutil.rmtree(folder / stale, ignore_errors=True)


def withdraw_final(folder: Path) -> None:
    """Remove the final state recorded (a cancel the scheduler refused, an earlier run's failure that a restart
    overrides)."""
    (folder / FINAL).unlink(missing_ok=True)
    note_change(folder)
