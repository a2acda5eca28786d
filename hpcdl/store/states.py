"""Every state name, defined once: those a job (or a sweep) is recorded and listed in, and the scheduler's that
hpcdl reads (Slurm's, from squeue and sacct). How a job's state is judged: hpcdl.lifecycle.states."""

from __future__ import annotations

SUBMITTING = "SUBMITTING"
"""Written into the store, not yet taken by its backend."""
PENDING = "PENDING"
RUNNING = "RUNNING"
REQUEUED = "REQUEUED"
"""Stopped on the stop signal with a checkpoint and queued again (status.json): it goes on from the checkpoint."""
COMPLETED = "COMPLETED"
FAILED = "FAILED"
CANCELLED = "CANCELLED"
TIMEOUT = "TIMEOUT"
STOPPED = "STOPPED"
"""Stopped on the stop signal with a checkpoint, not queued again: jobs resume goes on from it."""
OUT_OF_MEMORY = "OUT_OF_MEMORY"
NODE_FAIL = "NODE_FAIL"
LOST = "LOST"
"""A sweep's point whose folder is gone or cannot be trusted."""
INTERRUPTED = "INTERRUPTED"
"""The state of a sweep (and its points) whose submitter ended before the scheduler had them all."""
DAMAGED = "DAMAGED"
"""The state of a job whose manifest or status files cannot be read: shown, never acted on."""
PRIVATE = "PRIVATE"
"""Another user's job whose folder is theirs alone."""
UNKNOWN = "UNKNOWN"
"""No state recorded, and none the scheduler could give."""
RELEASED = "RELEASED"
"""A held pool that ended itself after its idle timeout."""
FINAL_STATES = (COMPLETED, FAILED, CANCELLED, TIMEOUT, STOPPED, OUT_OF_MEMORY, NODE_FAIL, LOST, INTERRUPTED)

SCHEDULER_FINAL = {TIMEOUT: TIMEOUT, OUT_OF_MEMORY: OUT_OF_MEMORY, NODE_FAIL: NODE_FAIL, CANCELLED: CANCELLED,
                   "DEADLINE": TIMEOUT, "PREEMPTED": CANCELLED, "BOOT_FAIL": NODE_FAIL, FAILED: FAILED,
                   COMPLETED: FAILED}
"""A scheduler's final state of a job that recorded none itself -> the job's (Slurm's COMPLETED without a
result is a failure: hydra#1928)."""
QUEUED_AGAIN = (PENDING, REQUEUED, "REQUEUE_HOLD", "REQUEUE_FED")
"""Slurm's states of a job it has queued again after a run (a job that ran says so in its status.json)."""
STATES = (SUBMITTING, PENDING, RUNNING, *FINAL_STATES, DAMAGED, UNKNOWN,
          "CONFIGURING", "COMPLETING", "SUSPENDED", REQUEUED, "REQUEUE_HOLD")
"""The states a job is listed in: hpcdl's own, then the scheduler's rarer open ones."""
