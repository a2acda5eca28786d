"""Each rank's failure as a structured record, and whether a failure is a cause or a consequence of another.

Modelled on torchelastic's ``@record`` error files: a rank that fails writes ``failures/rankN.json`` with the
time, rank, host, pid, exception type, message and traceback. Who else writes one: the heartbeat watcher for a
rank that fell silent (it cannot: stopped, frozen, lost, or hung), and the local launcher for a rank that a
signal ended (``kill -9``, the OOM killer). A failure is a *victim* when it only reports that a peer went away
or did not come: a collective's timeout, a gloo/NCCL "connection closed/reset by peer", an aborted
communicator, said by the communication layer (its type, message or a frame of the traceback); anything else (the
user's exception, their own request's timeout, an out-of-memory error, a signal, a silent rank) is a *cause*.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from pathlib import Path
from typing import Any, Optional

from hpcdl.distributed.env import node_name
from hpcdl.errors import FolderGoneError, HpcdlError
from hpcdl.store.atomic import atomic_write_text, make_folder
from hpcdl.store.files import FAILURE, FAILURES
from hpcdl.store.folders import read_json

CONSEQUENCE = re.compile(
    r"timed? ?out|timeout|deadline exceeded|connection (closed|reset|refused)|closed by peer|reset by peer|"
    r"broken pipe|end of file|socket closed|communicator (was )?aborted|NCCL (communicator|error).*abort|"
    r"remote process exited|peer .*(lost|gone|exited|closed)|MPI_ERR_PROC_FAILED|ProcessGroupNCCL.*watchdog",
    re.IGNORECASE)
"""What a failure says when it only reports that a peer went away or never came (checked on its last line)."""
DISTRIBUTED = re.compile(r"torch[/\\]distributed[/\\]|mpi4py|gloo|nccl|c10d|ProcessGroup|\bMPI_|^Dist\w*Error$",
                         re.IGNORECASE | re.MULTILINE)
"""The communication layer, named by a failure's type, message or a frame of its traceback."""


def is_consequence(kind: str, message: str, traceback: str = "") -> bool:
    """Whether a failure of exception type ``kind`` saying ``message`` (raised through ``traceback``, where
    known) reports another rank's failure: it says a peer went away or did not come, and the communication layer
    said it (a timeout of the user's own request or DataLoader is a cause)."""
    if kind in ("OutOfMemoryError", "MemoryError", "KeyboardInterrupt"):
        return False
    if CONSEQUENCE.search(f"{kind}: {message}") is None:
        return False
    frames = "\n".join(line for line in traceback.splitlines() if line.lstrip().startswith('File "'))
    return not frames or DISTRIBUTED.search("\n".join((kind, message, frames))) is not None


def exception_line(traceback: str) -> tuple[str, str]:
    """(exception type, message) from a Python traceback's last line (``ValueError: boom``); ('', last line)
    when ``traceback`` is no traceback or its last line has none of that shape."""
    lines = [line for line in traceback.rstrip("\n").splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    if "Traceback (most recent call last):" not in traceback:
        return "", last.strip()
    found = re.match(r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Failed|Warning)|[A-Z]\w*)(?::\s?(.*))?$",
                     last)
    if found is None or last.startswith((" ", "\t")):
        return "", last.strip()
    return found.group(1).rsplit(".", 1)[-1], (found.group(2) or "").strip()


def record(folder: Path, rank: int, kind: str, message: str, traceback: str, *, run: str, how: str = "exception",
           host: Optional[str] = None, pid: Optional[int] = None, noted_by: Optional[int] = None,
           cause: Optional[bool] = None) -> None:
    """Write rank ``rank``'s failure record (atomically; over one of an earlier run, never over this run's).

    ``how``: exception, signal, lost (silent heartbeat) or hang; ``cause`` defaults to is_consequence's answer."""
    entry = {"time": time.time(), "run": run, "rank": rank, "host": node_name() if host is None else host,
             "pid": os.getpid() if pid is None else pid,
             "how": how, "type": kind, "message": message, "traceback": traceback,
             "cause": not is_consequence(kind, message, traceback) if cause is None else cause}
    if noted_by is not None:
        entry["noted_by"] = noted_by
    path = folder / FAILURES / FAILURE.format(rank=rank)
    with contextlib.suppress(OSError, FolderGoneError, HpcdlError):  # a full or vanished store: the log tells
        existing = _read(path)
        if existing is not None and existing.get("run") == run:
            return  # this run's first record of the rank holds
        make_folder(folder / FAILURES)
        atomic_write_text(path, json.dumps(entry, indent=1))


def _read(path: Path) -> Optional[dict[str, Any]]:
    try:
        found = read_json(path)
    except (OSError, ValueError, HpcdlError):
        return None
    return found if isinstance(found, dict) else None


def records(folder: Path) -> list[dict[str, Any]]:
    """The failure records of the newest run that wrote any, earliest first (damaged or unsafe ones skipped)."""
    found = []
    for path in sorted((folder / FAILURES).glob(FAILURE.format(rank="*"))) if (folder / FAILURES).is_dir() else ():
        entry = _read(path)
        if entry is not None and isinstance(entry.get("rank"), int) and isinstance(entry.get("time"), (int, float)):
            found.append(entry)
    if not found:
        return []
    newest = max(found, key=lambda e: e["time"]).get("run")
    return sorted((e for e in found if e.get("run") == newest), key=lambda e: e["time"])
