"""Each rank's pace: how fast it steps, how much of a step is its own work, how long it waited for data.

The hot path adds a clock reading per step (``step``, called with the heartbeat's ``stepped``), the gradient
exchange's two marks (``exchanged``: the time the rank spent in backward and the gradient exchange, where it waits
for slower peers), the host time of other collectives and of the lead's files (``aside``) and the data wait (``waited``). A thread of the rank folds them into one JSON line of
``pace/rankN.jsonl`` every ``sample_s`` seconds, and writes a line when the run starts and ends; a few hundred
bytes per rank and sample. In a synchronous job every rank steps at the pace of the slowest, so the rank's own
time per step (step time less the exchange) is what tells a slow rank: a peer that waits for it spends that wait
in the exchange. ``hpcdl.store.pace`` reads the files (stragglers, effective training time).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from pathlib import Path
from typing import Any, Optional, Protocol

from hpcdl.distributed.env import node_name
from hpcdl.store.atomic import make_folder
from hpcdl.store.files import PACE, PACE_RANK


class Interval(Protocol):
    """Two marks on the step's timeline (hpcdl.train.datawait.Wait): seconds once both have passed."""

    def passed(self) -> bool: ...

    def seconds(self) -> float: ...


class _Counts:
    """What the hot path adds up between two samples."""

    def __init__(self) -> None:
        self.steps, self.wait_s, self.aside_s = 0, 0.0, 0.0
        self.first: Optional[float] = None
        self.last = 0.0
        self.exchanges: list[Interval] = []


_lock = threading.Lock()
_counts = _Counts()
_recorder: Optional["_Recorder"] = None


def step() -> None:
    """Note that this rank has finished a step (host time); like every note here, nothing without a recorder."""
    if _recorder is None:
        return
    now = time.perf_counter()
    with _lock:
        _counts.steps += 1
        _counts.last = now
        if _counts.first is None:
            _counts.first = now


def exchanged(interval: Interval) -> None:
    """Note one step's backward and gradient exchange (its seconds are read when the sample is taken); nothing
    without a recorder (a rank hpcdl's worker did not start), which would never read them."""
    if _recorder is None:
        return
    with _lock:
        _counts.exchanges.append(interval)


def aside(seconds: float) -> None:
    """Note host seconds of a step that are not the rank's own share of training: a collective outside the
    exchange (where it waits for peers), or the lead's own files (plot, checkpoint), which no peer has to do."""
    if _recorder is None:
        return
    with _lock:
        _counts.aside_s += seconds


def waited(seconds: float) -> None:
    """Note seconds one step waited for its input."""
    if _recorder is None:
        return
    with _lock:
        _counts.wait_s += seconds


def sample_interval(window_s: float) -> float:
    """Seconds between samples for a straggler window of ``window_s``: ten per window, 1 to 30 s apart."""
    return max(1.0, min(30.0, window_s / 10))


def start(folder: Path, rank: int, token: str, window_s: float) -> None:
    """Write this run's start line and sample this rank's pace every sample_interval(window_s) from now on."""
    global _recorder, _counts
    with _lock:
        _counts = _Counts()  # what was noted before (an earlier run in this process) is not this run's
    _recorder = _Recorder(make_folder(folder / PACE) / PACE_RANK.format(rank=rank), token)
    _recorder.line({"event": "start", "host": node_name(), "pid": os.getpid()})
    threading.Thread(target=_recorder.run, args=(sample_interval(window_s),), name="hpcdl-pace",
                     daemon=True).start()


def finish() -> None:
    """Write the last sample and this run's end line (the rank returned, or stopped on the signal)."""
    if _recorder is not None:
        _recorder.sample()
        _recorder.line({"event": "end"})
        _recorder.done = True


class _Recorder:
    """Appends this rank's samples to its pace file (each line written whole, in one write)."""

    def __init__(self, path: Path, token: str) -> None:
        self.path, self.token, self.done = path, token, False
        self.steps = 0
        self.last: Optional[float] = None
        self.pending: list[Interval] = []
        self.write_lock = threading.RLock()

    def run(self, interval: float) -> None:
        while not self.done:
            time.sleep(interval)
            if not self.done:
                self.sample()

    def sample(self) -> None:
        """Fold what the hot path noted since the last sample into one line (none when no step was taken)."""
        global _counts
        with self.write_lock, _lock:
            counts, _counts = _counts, _Counts()
        self.pending += counts.exchanges
        if counts.steps == 0:
            return
        done = [interval.passed() for interval in self.pending]
        passed = [interval for interval, ok in zip(self.pending, done) if ok]
        self.pending = [interval for interval, ok in zip(self.pending, done) if not ok][-1000:]
        record: dict[str, Any] = {"steps": self.steps + counts.steps, "wait_s": round(counts.wait_s, 6)}
        if self.last is None:  # the run's first step: when it came (the time before it is the run's start-up)
            record["first_step_at"] = round(time.time() - (time.perf_counter() - counts.first), 3)
            timed, since = counts.steps - 1, counts.first
        else:
            timed, since = counts.steps, self.last
        if timed:
            record.update(timed=timed, step_s=round((counts.last - since) / timed, 6))
        self.steps, self.last = self.steps + counts.steps, counts.last
        if passed or counts.aside_s:
            record["exchange_s"] = round((counts.aside_s + sum(i.seconds() for i in passed)) / counts.steps, 6)
        self.line(record)

    def line(self, record: dict[str, Any]) -> None:
        """Append ``record`` with the run token and the wall time (a full or vanished store: nothing)."""
        text = json.dumps({"run": self.token, "at": round(time.time(), 3), **record}) + "\n"
        with self.write_lock, contextlib.suppress(OSError):
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                os.write(fd, text.encode())
            finally:
                os.close(fd)
