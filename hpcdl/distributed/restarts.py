"""A job's runs, as its ranks keep them: record a failure unless the scheduler has queued the job again, and
withdraw an earlier run's failure when the job goes on.

A node failure, a preemption without grace or an operator's requeue end a run and queue the job again with its
restart count raised. A rank that outlives such a run (on a node that lost its scheduler daemon, or between the
scheduler's TERM and KILL) must not record the job as failed: the job goes on from its checkpoint. What the
scheduler says of the job's runs comes from the job's backend (``JobRuns``, part of ``hpcdl.cluster.Backend``).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Optional, Protocol

from hpcdl.store.files import FINAL
from hpcdl.store.folders import read_json
from hpcdl.store.safety import UnsafeFolderError
from hpcdl.store.states import FAILED
from hpcdl.store.status import withdraw_final, write_final


class JobRuns(Protocol):
    """What a rank asks its scheduler of the job it runs in (a backend answers; one without requeues trivially)."""

    scheduler: str
    """The scheduler's name for people ('Slurm')."""

    def this_run(self) -> int:
        """This run's restart count: 0 for a first run (and for a job the scheduler never queues again)."""

    def this_job(self) -> Optional[str]:
        """The scheduler's id of the job this process runs in (an array task's own id); None where it has none."""

    def requeued_since_start(self) -> bool:
        """Whether the scheduler has queued this job again since this run started."""

    def how_run_ended(self, run: int) -> Optional[str]:
        """The scheduler's final state of run ``run`` of this job (PREEMPTED, REQUEUED, a node failure with the
        nodes that went down: ``NODE_FAIL (n2: Not responding)``); None where it cannot say."""


def recorded_final(folder: Path) -> Optional[dict[str, Any]]:
    """The job's final.json; None when there is none. One that cannot be read (damaged, or not this user's
    alone) is a final state all the same, and no earlier run's failure: ``{}``."""
    try:
        return read_json(folder / FINAL)
    except (ValueError, UnsafeFolderError):
        return {}


def record_failure(folder: Path, runs: JobRuns, reason: str, **fields: Any) -> bool:
    """Record the job FAILED for ``reason`` (the first final state holds) unless its scheduler has queued it again
    since this run started: then only say so on stderr. True when FAILED was recorded by this call."""
    final = recorded_final(folder)
    if final is not None and not is_earlier_runs_failure(final, runs):
        return False  # recorded already: the first holds, and the scheduler need not be asked
    if runs.requeued_since_start():
        print(f"[hpcdl] {reason}; {runs.scheduler} has queued the job again: it goes on from its newest "
              "checkpoint", file=sys.stderr, flush=True)
        return False
    return write_final(folder, FAILED, reason=reason, slurm_job=runs.this_job(), restarts=runs.this_run(), **fields)


def is_earlier_runs_failure(final: dict[str, Any], runs: JobRuns) -> bool:
    """Whether ``final`` (a final.json) is the FAILED of an earlier run of this scheduler job, which a restart of
    the job overrides (not a cancel's, not this run's, not another job's). Its ``slurm_job`` field names the
    scheduler's job whatever the backend (a name the store keeps for the records already written)."""
    return (final.get("state") == FAILED and final.get("slurm_job") is not None
            and final.get("slurm_job") == runs.this_job() and isinstance(final.get("restarts"), int)
            and final["restarts"] < runs.this_run())


def record_final(folder: Path, runs: JobRuns, state: str, **fields: Any) -> bool:
    """Record this run's final state ``state`` (the first holds), over an earlier run's failure that a rank of a
    run the scheduler ended wrote late; True when ``state`` holds."""
    withdraw_earlier_failure(folder, runs)
    return write_final(folder, state, **fields)


def withdraw_earlier_failure(folder: Path, runs: JobRuns) -> Optional[dict[str, Any]]:
    """Remove an earlier run's FAILED state (see is_earlier_runs_failure) and return it; None when there is none."""
    final = recorded_final(folder)
    if final is None or not is_earlier_runs_failure(final, runs):
        return None
    withdraw_final(folder)
    return final
