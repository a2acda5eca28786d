"""Heartbeats: every rank says it is alive; two ranks watch the others and end the job naming a silent one.

A thread in each rank of a multi-rank job rewrites ``heartbeats/rankN.json``
(host, pid, a tick count, whether it has trained a step) every few seconds. A
rank stopped with SIGSTOP, frozen, or lost with its node stops ticking while
its peers wait for it in a collective. The lead rank and the one half the
world after it (on another node, where there are several) read every rank's
file at each tick; a rank whose file has not changed for the
timeout (``startup_s`` until that rank's first step: imports, compiling, the
first collective; ``timeout_s`` after) is named in the job's FAILED state
(the first final state written holds), and the watching rank exits with an
error, so hpcdl's launcher or srun's kill-on-bad-exit ends the others.
Changes are timed by the watcher's own monotonic clock: nodes' clocks need not
agree, and a watcher that was itself stopped (a suspended job) starts its
count afresh. Files of an earlier run of the job (before a requeue or a resume)
carry another run token and count as not written yet. The ticker is a thread of
its own: a rank stuck inside a collective still ticks (the collective timeout
ends that one); a stopped, frozen or lost process does not.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator, Optional

from hpcdl.distributed import failures, pace, script_steps
from hpcdl.distributed.restarts import JobRuns, record_failure
from hpcdl.distributed.env import node_name
from hpcdl.errors import FolderGoneError, HpcdlError
from hpcdl.store.atomic import atomic_write_text, make_folder
from hpcdl.store.files import HEARTBEAT, HEARTBEATS
from hpcdl.store.folders import read_json

RUN_TOKEN = "HPCDL_RUN_TOKEN"
"""Set by hpcdl's local launcher for its ranks; on Slurm the job id and restart count stand for it."""

_stepped = threading.Event()
_steps = [0]
_stepping = [True]
_pauses = [0]
_followed: list[int] = []
_ticker: Optional["_Ticker"] = None


def stepped() -> None:
    """Note that this rank has trained (or reported) a step: from now on the short timeout applies to it; the
    step counts toward the rank's pace. In a script's process the step goes to the rank's worker."""
    _stepped.set()
    _steps[0] += 1
    pace.step()
    script_steps.note(script_steps.STEP)


def steps_ended() -> None:
    """Note that this rank makes no more steps (a worker without load, or a run past its last step, validating
    and saving): the hang watcher stops expecting them of it."""
    _stepping[0] = False
    script_steps.note(script_steps.ENDED)


@contextlib.contextmanager
def between_steps() -> Iterator[None]:
    """A stretch of the run without steps (a validation, a checkpoint): the hang watcher leaves it out of a
    rank's time without a step (it is told while the stretch lasts, and counts its end as progress)."""
    was = _stepping[0]
    _stepping[0] = False
    try:
        yield
    finally:
        _stepping[0] = was
        _pauses[0] += 1


def follow(pid: int) -> None:
    """Tick only while process ``pid`` (this rank's script) is not stopped."""
    _followed.append(pid)


def finish() -> None:
    """Note that this rank has returned: the watchers no longer expect its heartbeat."""
    if _ticker is not None:
        _ticker.write(done=True)


def run_token() -> str:
    """What tells this run of the job from an earlier one (a requeue, a resume): set by the worker."""
    return os.environ.get(RUN_TOKEN, "")


def interval_for(timeout_s: float) -> float:
    """Seconds between ticks: several per timeout, at most 5."""
    return max(0.5, min(5.0, timeout_s / 6))


def start(folder: Path, rank: int, world_size: int, lead_rank: int, timeout_s: float, startup_s: float,
          runs: JobRuns) -> None:
    """Start this rank's ticking thread, and its watching thread when it is the lead rank or the one half the
    world away (ranks fill nodes in order, so that one is on another node where there are several); ``runs``:
    the job's backend, asked before a silent rank is recorded as the job's failure."""
    global _ticker
    beats = make_folder(folder / HEARTBEATS)
    token, interval = run_token(), interval_for(timeout_s)
    _ticker = _Ticker(beats, rank, token)
    threading.Thread(target=_ticker.run, args=(interval,), name="hpcdl-heartbeat", daemon=True).start()
    if rank in (lead_rank, (lead_rank + world_size // 2) % world_size):  # half the ranks apart: another node
        watcher = Watcher(folder, beats, world_size, rank, token, timeout_s, startup_s, runs)
        threading.Thread(target=watcher.run, args=(interval,), name="hpcdl-heartbeat-watch", daemon=True).start()


class _Ticker:
    """Rewrites this rank's heartbeat file (atomically, mode 0600, as every job file)."""

    def __init__(self, beats: Path, rank: int, token: str) -> None:
        self.path, self.rank, self.token = beats / HEARTBEAT.format(rank=rank), rank, token
        self.host = node_name()
        self.pid, self.ticks = os.getpid(), 0
        self.lock = threading.Lock()
        self.done = False

    def run(self, interval: float) -> None:
        while not self.done:
            if not any(_is_stopped(pid) for pid in _followed):
                self.write()
            time.sleep(interval)

    def write(self, done: bool = False) -> None:
        """One heartbeat; ``done``: the last, saying this rank returned (tried until written, at most 3 times)."""
        with self.lock:
            for _ in range(3 if done else 1):
                if self.done:
                    return
                self.ticks += 1
                record = {"rank": self.rank, "host": self.host, "pid": self.pid, "run": self.token,
                          # a followed script's state is read exactly: no long allowance for its start
                          "ticks": self.ticks, "stepped": _stepped.is_set() or bool(_followed), "steps": _steps[0],
                          "stepping": _stepping[0], "pauses": _pauses[0], "done": done}
                try:
                    atomic_write_text(self.path, json.dumps(record))
                except (OSError, HpcdlError):  # a full or vanished store: the watchers judge the silence
                    continue
                self.done = done
                return


def _is_stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped (state T or t in /proc); False once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] in "Tt"


class Watcher:
    """Reads every rank's heartbeat and ends the job when one falls silent."""

    def __init__(self, folder: Path, beats: Path, world_size: int, rank: int, token: str, timeout_s: float,
                 startup_s: float, runs: JobRuns) -> None:
        self.folder, self.beats, self.rank, self.token, self.runs = folder, beats, rank, token, runs
        self.timeout_s, self.startup_s = timeout_s, startup_s
        now = time.monotonic()
        self.seen: dict[int, tuple[Optional[dict[str, Any]], float]] = {r: (None, now) for r in range(world_size)}

    def run(self, interval: float) -> None:
        """Read every rank's heartbeat each ``interval``; end the job at the first silent one."""
        last = time.monotonic()
        while True:
            time.sleep(interval)
            now = time.monotonic()
            if now - last > 2 * interval + 1:  # this process was stopped too (a suspended job): start afresh
                self.seen = {rank: (beat, now) for rank, (beat, _) in self.seen.items()}
            last = now
            silent = self.silent_rank()
            if silent is not None:
                self.fail(*silent)

    def silent_rank(self) -> Optional[tuple[int, Optional[dict[str, Any]], float]]:
        """(rank, its last heartbeat, seconds silent) of the first rank past its timeout, or None."""
        now = time.monotonic()
        for rank, (last, since) in self.seen.items():
            try:
                beat = read_json(self.beats / HEARTBEAT.format(rank=rank))
            except (OSError, ValueError, HpcdlError):  # damaged, or not safe to read: judged by the next read
                beat = last
            if beat is not None and beat.get("run") != self.token:
                beat = None  # an earlier run's
            if beat != last:
                self.seen[rank] = (beat, now)
                continue
            if beat is not None and beat.get("done"):
                continue
            limit = self.timeout_s if beat is not None and beat.get("stepped") else self.startup_s
            if now - since > limit:
                return rank, beat, now - since
        return None

    def fail(self, rank: int, beat: Optional[dict[str, Any]], silent_s: float) -> None:
        """Record FAILED naming ``rank`` (the first final state holds) and end this rank, so the job ends."""
        where = f" (host {beat['host']}, pid {beat['pid']})" if beat else ""
        what = "sent no heartbeat" if beat else "never sent a heartbeat"
        reason = (f"rank {rank}{where} {what} for {silent_s:.0f} s: stopped, frozen or lost; "
                  f"noticed by rank {self.rank}")
        failures.record(self.folder, rank, "Lost", f"{what} for {silent_s:.0f} s: stopped, frozen or lost", "",
                        run=self.token, how="lost", host=beat["host"] if beat else "",
                        pid=beat["pid"] if beat else 0, noted_by=self.rank, cause=True)
        with contextlib.suppress(OSError, FolderGoneError):
            record_failure(self.folder, self.runs, reason, rank=rank)
        print(f"[hpcdl] {reason}", file=sys.stderr, flush=True)
        os._exit(1)
