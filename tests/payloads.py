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


def lose_rank_one(seconds: float) -> None:
    """Rank 1 is killed at once; the others sleep ``seconds`` in no collective (nothing of theirs notices)."""
    import signal

    if os.environ.get("RANK", os.environ.get("SLURM_PROCID")) == "1":
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(seconds)


def detach_heartbeat_then_sleep(folder: str, seconds: float) -> None:
    """Start a grandchild that leaves the job (a session of its own, its parent exits at once) and writes the time
    to FOLDER/heartbeat every 0.1 s, its pid in FOLDER/detached; then sleep ``seconds``."""
    import subprocess
    import sys

    beat = Path(folder, "heartbeat")
    loop = f"import pathlib, time\nwhile True:\n    pathlib.Path({str(beat)!r}).write_text(str(time.time()))\n" \
           "    time.sleep(0.1)"
    spawn = (f"import subprocess, sys, pathlib; p = subprocess.Popen([sys.executable, '-c', {loop!r}], "
             f"start_new_session=True); pathlib.Path({str(Path(folder, 'detached'))!r}).write_text(str(p.pid))")
    subprocess.run([sys.executable, "-c", spawn], check=True)
    time.sleep(seconds)
