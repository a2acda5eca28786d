"""A Slurm job's runs, asked from inside one: this run's restart count, whether Slurm has requeued the job
since it started, and how an earlier run ended.

A node failure, a preemption without grace or an operator's ``scontrol requeue`` end a run and queue the job
again with its restart count raised. A rank that outlives such a run (on a node that lost its slurmd, or
between Slurm's TERM and KILL) must not record the job as failed: the job goes on from its checkpoint.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

from hpcdl.store.files import FINAL
from hpcdl.store.folders import read_json
from hpcdl.store.safety import UnsafeFolderError
from hpcdl.store.states import FAILED, NODE_FAIL
from hpcdl.store.status import withdraw_final, write_final

QUERY_TIMEOUT_S = 30


def this_run() -> int:
    """This run's restart count (0 for a first run, and outside Slurm)."""
    return int(os.environ.get("SLURM_RESTART_COUNT", "0"))


def _ask(command: list[str]) -> str:
    """A Slurm client command's output; empty when it cannot be run or fails."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=QUERY_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout if done.returncode == 0 else ""


def requeued_since_start() -> bool:
    """Whether Slurm has queued this job again since this run started (its restart count is past this run's)."""
    job = this_job()
    if not job:
        return False
    found = re.search(r"\bRestarts=(\d+)", _ask(["scontrol", "show", "job", job]))
    return found is not None and int(found.group(1)) > this_run()


def how_run_ended(run: int) -> Optional[str]:
    """Slurm's final state of run ``run`` of this job from its accounting (PREEMPTED, REQUEUED, ...), a node
    failure with the nodes that went down meanwhile (``NODE_FAIL (n2: Not responding)``); None where there is
    none."""
    job = this_job()
    if not job:
        return None
    runs = _ask(["sacct", "-D", "-X", "-n", "-P", "-o", "State,Start,End,NodeList", "-j", job]).splitlines()
    if run >= len(runs) or runs[run].count("|") != 3:
        return None
    state, start, end, nodes = runs[run].split("|")
    state = state.split()[0]
    if state != NODE_FAIL:
        return state
    with contextlib.suppress(ValueError):  # the node is marked down as the run ends: a minute's margin
        end = (datetime.datetime.fromisoformat(end) + datetime.timedelta(minutes=1)).isoformat(timespec="seconds")
    events = _ask(["sacctmgr", "-n", "-P", "show", "event", f"start={start}", f"end={end}", f"nodes={nodes}",
                   "format=NodeName,Reason"])
    down = sorted({line.replace("|", ": ", 1) for line in events.splitlines() if line.split("|")[0]})
    return f"{state} ({', '.join(down)})" if down else state


def this_job() -> Optional[str]:
    """The Slurm job id this process runs in (an array task's own id), None outside Slurm."""
    return os.environ.get("SLURM_JOB_ID")


def recorded_final(folder: Path) -> Optional[dict[str, Any]]:
    """The job's final.json; None when there is none. One that cannot be read (damaged, or not this user's
    alone) is a final state all the same, and no earlier run's failure: ``{}``."""
    try:
        return read_json(folder / FINAL)
    except (ValueError, UnsafeFolderError):
        return {}


def record_failure(folder: Path, reason: str, **fields: Any) -> bool:
    """Record the job FAILED for ``reason`` (the first final state holds) unless Slurm has queued it again since
    this run started: then only say so on stderr. True when FAILED was recorded by this call."""
    final = recorded_final(folder)
    if final is not None and not is_earlier_runs_failure(final):
        return False  # recorded already: the first holds, and Slurm need not be asked
    if requeued_since_start():
        print(f"[hpcdl] {reason}; Slurm has queued the job again: it goes on from its newest checkpoint",
              file=sys.stderr, flush=True)
        return False
    return write_final(folder, FAILED, reason=reason, slurm_job=this_job(), restarts=this_run(), **fields)


def is_earlier_runs_failure(final: dict[str, Any]) -> bool:
    """Whether ``final`` (a final.json) is the FAILED of an earlier run of this Slurm job, which a restart of the
    job overrides (not a cancel's, not this run's, not another job's)."""
    return (final.get("state") == FAILED and final.get("slurm_job") is not None
            and final.get("slurm_job") == this_job() and isinstance(final.get("restarts"), int)
            and final["restarts"] < this_run())


def record_final(folder: Path, state: str, **fields: Any) -> bool:
    """Record this run's final state ``state`` (the first holds), over an earlier run's failure that a rank of a
    run Slurm ended wrote late; True when ``state`` holds."""
    withdraw_earlier_failure(folder)
    return write_final(folder, state, **fields)


def withdraw_earlier_failure(folder: Path) -> Optional[dict[str, Any]]:
    """Remove an earlier run's FAILED state (see is_earlier_runs_failure) and return it; None when there is none."""
    final = recorded_final(folder)
    if final is None or not is_earlier_runs_failure(final):
        return None
    withdraw_final(folder)
    return final
