"""A job's own word on its state: status.json while it runs, final.json once it has ended.

status.json has one writer, the job's lead rank (RUNNING, with its host, pid and
start time). final.json holds the final state (COMPLETED, FAILED, TIMEOUT,
CANCELLED, ...) and is created once: of the ranks, the launcher, a cancel and a
listing that each may end a job, the first wins, and a rank that outlived a time
limit cannot turn TIMEOUT into COMPLETED.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

from hpcdl.store.atomic import create_once
from hpcdl.store.changes import note_change
from hpcdl.store.files import FINAL, RANK_RESULTS, RANKS_DONE, STATUS
from hpcdl.store.folders import read_json, write_json


def write_status(folder: Path, state: str, **fields: Any) -> None:
    """Record the running job's state (the lead rank's alone; fields of earlier writes are kept)."""
    status = read_json(folder / STATUS) or {}
    status.update(fields, state=state, updated_at=time.time())
    write_json(folder / STATUS, status)


def write_final(folder: Path, state: str, durable: bool = True, **fields: Any) -> bool:
    """Record the job's final state unless one is recorded already; True when this call's state holds.
    ``durable=False``: one of many synced together (atomic.sync_filesystem)."""
    final = {**fields, "state": state, "ended_at": fields.get("ended_at", time.time())}
    won = create_once(folder / FINAL, json.dumps(final, indent=1, sort_keys=True) + "\n", durable)
    if won:
        note_change(folder)
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
