"""A script's steps told to its rank: ``hpcdl.report`` in a script's process notes each step on a pipe that the
rank's hpcdl worker reads, so that the rank's heartbeat (the hang watcher) and pace count the script's steps as
they count the built-in trainer's.

The worker passes the pipe's writing end to the script and names it (descriptor and inode) in SCRIPT_STEPS; a
process that inherited the name but not the pipe (a child started with its descriptors closed, where the number
may now be another file) finds another inode there, or none, and notes nothing. A note never blocks the script:
one that finds the pipe full is dropped (the count moves on with the next).
"""

from __future__ import annotations

import contextlib
import os
import stat
import threading
from typing import Callable, Optional

SCRIPT_STEPS = "HPCDL_SCRIPT_STEPS"
"""Set for a script's process: FD:INODE of the pipe its steps are noted on."""
STEP, ENDED = b"s", b"e"
"""A step made; no more steps to come (the script reported its last)."""

_pipe: list[Optional[int]] = []


def open_channel(on_step: Callable[[], None], on_ended: Callable[[], None]) -> tuple[int, dict[str, str]]:
    """A pipe for a script's notes, read by a thread of this process that calls ``on_step`` and ``on_ended``:
    (the descriptor to pass to the script and to close here once it started, the script's variable)."""
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    threading.Thread(target=_read, args=(read_end, on_step, on_ended), name="hpcdl-script-steps",
                     daemon=True).start()
    return write_end, {SCRIPT_STEPS: f"{write_end}:{os.fstat(write_end).st_ino}"}


def _read(read_end: int, on_step: Callable[[], None], on_ended: Callable[[], None]) -> None:
    with contextlib.suppress(OSError):
        while chunk := os.read(read_end, 4096):  # empty once the script (and each child holding the pipe) ended
            for note in chunk:
                (on_ended if note == ENDED[0] else on_step)()
    os.close(read_end)


def note(what: bytes) -> None:
    """Note ``what`` (STEP, ENDED) for this script's rank; nothing outside a script's process."""
    if not _pipe:
        _pipe.append(_named_pipe())
    if _pipe[0] is not None:
        with contextlib.suppress(OSError):  # full (dropped), or the worker is gone
            os.write(_pipe[0], what)


def _named_pipe() -> Optional[int]:
    """The descriptor SCRIPT_STEPS names when it is that pipe in this process, else None."""
    fd, _, inode = os.environ.get(SCRIPT_STEPS, "").partition(":")
    try:
        found = os.fstat(int(fd))
    except (ValueError, OSError):
        return None
    return int(fd) if stat.S_ISFIFO(found.st_mode) and str(found.st_ino) == inode else None
