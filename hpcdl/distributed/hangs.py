"""Hangs: a multi-rank job that stops making progress is diagnosed before it is ended.

The lead rank reads every rank's step count from its heartbeat (``hpcdl.distributed.heartbeat``; a script's
``hpcdl.report`` steps reach it through ``hpcdl.distributed.script_steps``). A rank whose count has not moved for
``hang_timeout_s`` (``hang_startup_s`` before its first step, where steps are sure to come: the built-in trainer;
your own code is watched once it reports one) while it still heartbeats is hung: the lead asks every rank for its
Python stacks (``hpcdl.distributed.stacks``) and flight-recorder dump, groups the stacks, records as the cause
(with its stack) the rank(s) outside the collective the others wait in, or, where every rank that answered waits
in one, those the flight recorder shows behind the newest collective; it records the job FAILED naming them and
ends itself, so that the job ends.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, Optional

from hpcdl.distributed import failures, flight_recorder, stacks
from hpcdl.distributed.restarts import JobRuns, record_failure
from hpcdl.errors import FolderGoneError, HpcdlError
from hpcdl.store.files import HEARTBEAT, HEARTBEATS
from hpcdl.store.folders import read_json

STACKS_WAIT_S = 10.0
"""The longest a hang's diagnosis waits for the ranks' stacks."""
FLIGHT_WAIT_S = 5.0
"""The longest it then waits for the flight-recorder dumps of the ranks that have one."""


def start(folder: Path, world_size: int, rank: int, token: str, timeout_s: float, startup_s: Optional[float],
          interval: float, runs: JobRuns, waited_for_s: Optional[float] = None) -> None:
    """Watch the ranks' step counts from this (the lead) rank; ``startup_s`` None: no limit before a first step;
    ``runs``: the job's backend, asked before a hang is recorded as the job's failure; ``waited_for_s``: the
    shorter limit for a rank that others wait for in a collective (see HangWatcher)."""
    watcher = HangWatcher(folder, world_size, rank, token, timeout_s, startup_s, runs, waited_for_s)
    if waited_for_s is not None and waited_for_s < timeout_s:
        print(f"[hpcdl] hang watch: a rank that makes no step for {waited_for_s:.0f} s while the others wait for it "
              f"in a collective is hung (before their collective timeout ends the job), any rank after "
              f"{timeout_s:.0f} s (cluster.hang_timeout_s)", file=sys.stderr, flush=True)
    threading.Thread(target=watcher.run, args=(interval,), name="hpcdl-hang-watch", daemon=True).start()


class HangWatcher:
    """Ends the job, with every rank's stacks written, when a rank's step count stops moving: after ``timeout_s``
    whatever the ranks do, and after ``waited_for_s`` already when the stacks show it outside the collective the
    other ranks wait in (a stretch where no rank waits, as every rank compiling or running callbacks, is no hang
    before ``timeout_s``)."""

    def __init__(self, folder: Path, world_size: int, rank: int, token: str, timeout_s: float,
                 startup_s: Optional[float], runs: JobRuns, waited_for_s: Optional[float] = None) -> None:
        self.folder, self.world_size, self.rank, self.token, self.runs = folder, world_size, rank, token, runs
        self.timeout_s, self.startup_s = timeout_s, startup_s
        self.waited_for_s = min(timeout_s, waited_for_s) if waited_for_s is not None else timeout_s
        self.seen: dict[int, tuple[tuple[int, int], float]] = {}  # rank: ((steps, pauses ended), since)

    def run(self, interval: float) -> None:
        last = time.monotonic()
        while True:
            time.sleep(interval)
            now = time.monotonic()
            if now - last > 2 * interval + 1:  # this process was stopped (a suspended job): count afresh
                self.seen = {rank: (progress, now) for rank, (progress, _) in self.seen.items()}
            last = now
            hung = self.stalled_rank()
            if hung is not None:
                self.diagnose(*hung)

    def stalled_rank(self) -> Optional[tuple[int, int, float]]:
        """(rank, its step count, seconds without a step) of the first rank past its limit, or None."""
        now = time.monotonic()
        for rank in range(self.world_size):
            try:
                beat = read_json(self.folder / HEARTBEATS / HEARTBEAT.format(rank=rank))
            except (OSError, ValueError, HpcdlError):
                continue
            if not isinstance(beat, dict) or beat.get("run") != self.token or beat.get("done") \
                    or beat.get("stepping") is False:
                self.seen.pop(rank, None)  # not started, another run's, returned, between or past its steps
                continue  # (validating, saving): counted afresh once it steps; the heartbeat watcher judges silence
            steps = int(beat.get("steps") or 0)
            progress = (steps, int(beat.get("pauses") or 0))  # a validation or checkpoint ended: progress too
            known = self.seen.get(rank)
            if known is None or known[0] != progress:
                self.seen[rank] = (progress, now)
                continue
            limit = self.waited_for_s if steps > 0 else self.startup_s
            if limit is not None and now - known[1] > limit:
                return rank, steps, now - known[1]
        return None

    def stacks_and_dumps(self) -> dict[int, dict[str, Any]]:
        """Every rank's stacks, each rank that has a flight recorder's dump of this moment written (those of an
        earlier moment removed first)."""
        flight_recorder.remove_dumps(self.folder, self.world_size)
        asked = stacks.request(self.folder, flight=True)
        found = stacks.collect(self.folder, asked, self.world_size, STACKS_WAIT_S)
        flight_recorder.wait_for_dumps(self.folder, [r for r, entry in found.items() if entry.get("flight")],
                                       FLIGHT_WAIT_S)
        return found

    def late_groups(self, found: dict[int, dict[str, Any]]) -> list[tuple[list[int], list[list[Any]]]]:
        """The ranks the flight recorder's dumps show behind the newest collective, each with its stack (none
        where it gave none), where two rounds of dumps agree (healthy ranks whose collectives move on dump a
        moment apart and may seem behind once); the outliers where the stacks alone tell none."""
        first = flight_recorder.newest_collectives(self.folder, self.world_size)
        if not flight_recorder.lagging_ranks(first, self.world_size):
            return []
        self.stacks_and_dumps()
        second = flight_recorder.newest_collectives(self.folder, self.world_size)
        if second != first:
            return []  # the collectives moved on: no rank is stuck behind
        return [([r], found.get(r, {}).get("main") or []) for r in flight_recorder.lagging_ranks(second,
                                                                                                self.world_size)]

    def diagnose(self, rank: int, steps: int, stalled_s: float) -> None:
        """Gather every rank's stacks, record the outliers as the cause and FAILED, and end this rank; before
        ``timeout_s``, only where some ranks wait in a collective for one outside it (else counted afresh)."""
        found = self.stacks_and_dumps()
        grouped = stacks.groups(found)
        waiting = any(stacks.in_collective(stack) for _, stack in grouped)
        outliers = stacks.outliers(grouped)
        late = [] if outliers or not waiting else self.late_groups(found)
        if steps > 0 and stalled_s <= self.timeout_s and not (waiting and (outliers or late)):
            self.seen = {r: (progress, time.monotonic()) for r, (progress, _) in self.seen.items()}
            flight_recorder.remove_dumps(self.folder, self.world_size)  # no verdict may read this moment's later
            return  # no rank waits for another: not yet a hang
        reason = hang_reason(found, self.world_size, rank, steps, stalled_s, outliers or late)
        where = ("not in the collective the other ranks wait in" if outliers else
                 "behind the collective the other ranks wait in (flight recorder)")
        for ranks, stack in outliers or late:
            for outlier in ranks:
                entry = found.get(outlier, {})
                failures.record(self.folder, outlier, "Hang", f"{where} (no step for {stalled_s:.0f} s)",
                                stacks.format_stack(stack), run=self.token, how="hang", host=entry.get("host"),
                                pid=entry.get("pid"), noted_by=self.rank, cause=True)
        with contextlib.suppress(OSError, FolderGoneError):
            record_failure(self.folder, self.runs, reason)
        print(f"[hpcdl] {reason}", file=sys.stderr, flush=True)
        os._exit(1)


def hang_reason(found: dict[int, dict[str, Any]], world_size: int, rank: int, steps: int, stalled_s: float,
                outliers: Optional[list[tuple[list[int], list[list[Any]]]]] = None) -> str:
    """One line: which rank made no step for how long, and which rank(s) the others wait for (``outliers``;
    those of the stacks when not given)."""
    head = (f"hang: rank {rank} made no step for {stalled_s:.0f} s" + (f" after step {steps}" if steps else "")
            + f"; stacks of {len(found)} of {world_size} ranks in the job folder")
    grouped = stacks.groups(found)
    odd = [r for ranks, _ in (stacks.outliers(grouped) if outliers is None else outliers) for r in ranks]
    silent = [r for r in range(world_size) if r not in found]
    if silent:
        head += f"; rank(s) {', '.join(map(str, silent))} gave none (stuck outside Python?)"
    if not odd:
        return head
    waiting = next((group for group in grouped if stacks.in_collective(group[1])), None)
    where = f" the others wait in {stacks.in_collective(waiting[1])}" if waiting else " the others are in"
    hosts = ", ".join(f"rank {r} (host {found[r].get('host')}, pid {found[r].get('pid')})" if r in found
                      else f"rank {r}" for r in odd)
    return f"{head}: {hosts} not where{where}"
