"""A Slurm job's runs, asked from inside one: this run's restart count, whether Slurm has requeued the job
since it started, and how an earlier run ended.

A node failure, a preemption without grace or an operator's ``scontrol requeue`` end a run and queue the job
again with its restart count raised. A rank that outlives such a run (on a node that lost its slurmd, or
between Slurm's TERM and KILL) must not record the job as failed: the job goes on from its checkpoint.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

from hpcdl.store.files import FINAL
from hpcdl.store.folders import read_json
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
    job = os.environ.get("SLURM_JOB_ID")
    if not job:
        return False
    found = re.search(r"\bRestarts=(\d+)", _ask(["scontrol", "show", "job", job]))
    return found is not None and int(found.group(1)) > this_run()


def how_run_ended(run: int) -> Optional[str]:
    """Slurm's final state of run ``run`` of this job (NODE_FAIL, PREEMPTED, REQUEUED, ...), from its accounting;
    None where there is none."""
    job = os.environ.get("SLURM_JOB_ID")
    runs = _ask(["sacct", "-D", "-X", "-n", "-P", "-o", "State", "-j", job]).split() if job else []
    return runs[run].split()[0] if run < len(runs) else None


def record_failure(folder: Path, reason: str, **fields: Any) -> bool:
    """Record the job FAILED for ``reason`` (the first final state holds) unless Slurm has queued it again since
    this run started: then only say so on stderr. True when FAILED was recorded by this call."""
    if requeued_since_start():
        print(f"[hpcdl] {reason}; Slurm has queued the job again: it goes on from its newest checkpoint",
              file=sys.stderr, flush=True)
        return False
    return write_final(folder, "FAILED", reason=reason, restarts=this_run(), **fields)


def failure_of_an_earlier_run(folder: Path) -> Optional[dict[str, Any]]:
    """The FAILED state an earlier run of this Slurm job recorded, which this restart overrides; None when the
    final state recorded is this run's, a cancel's, or there is none."""
    final = read_json(folder / FINAL)
    if final is None or final.get("state") != "FAILED" or not isinstance(final.get("restarts"), int):
        return None
    return final if final["restarts"] < this_run() else None


def withdraw_earlier_failure(folder: Path) -> Optional[dict[str, Any]]:
    """Remove an earlier run's FAILED state (see failure_of_an_earlier_run) and return it."""
    final = failure_of_an_earlier_run(folder)
    if final is not None:
        withdraw_final(folder)
    return final
