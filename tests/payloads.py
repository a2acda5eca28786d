"""Functions that test jobs run: standard library only, so that a rank starts in a fraction of a second."""

from __future__ import annotations

import os
import time
from pathlib import Path


def add(a: int, b: int) -> int:
    return a + b


def note_pid_then_sleep(folder: str, seconds: float) -> str:
    """Write this rank's pid to FOLDER/pidRANK, sleep, then write FOLDER/finishedRANK."""
    rank = os.environ.get("RANK", "0")
    Path(folder, f"pid{rank}").write_text(str(os.getpid()))
    time.sleep(seconds)
    Path(folder, f"finished{rank}").write_text("")
    return "finished"
