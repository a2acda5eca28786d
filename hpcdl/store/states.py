"""A job's state: its own status file first, the scheduler for what the file cannot know.

A job that the scheduler no longer runs and that wrote no final status ended
without a result (killed, out of memory, node lost); it is FAILED, or what the
scheduler says it was (TIMEOUT, CANCELLED, ...), even where Slurm says COMPLETED
(hydra#1928). Final states are written back, so each job is asked about once.
"""

from __future__ import annotations

from collections import defaultdict

from hpcdl.cluster import backend_for
from hpcdl.store.files import CANCELLED, STATUS
from hpcdl.store.folders import FINAL_STATES, JobRecord, read_json, write_status

SCHEDULER_FINAL = {"TIMEOUT": "TIMEOUT", "OUT_OF_MEMORY": "OUT_OF_MEMORY", "NODE_FAIL": "NODE_FAIL",
                   "CANCELLED": "CANCELLED", "DEADLINE": "TIMEOUT", "PREEMPTED": "CANCELLED",
                   "BOOT_FAIL": "NODE_FAIL", "FAILED": "FAILED", "COMPLETED": "FAILED"}


def resolve_states(records: list[JobRecord]) -> None:
    """Set ``state`` and ``reason`` of every record: one scheduler query per backend in all."""
    open_records: dict[str, list[JobRecord]] = defaultdict(list)
    for record in records:
        if not record.final:
            open_records[record.backend].append(record)
    for backend, group in open_records.items():
        live = backend_for(backend).live_states(group)
        for record in group:
            _resolve(record, None if live is None else live.get(record.id), asked=live is not None)


def _resolve(record: JobRecord, scheduler_state: str | None, asked: bool) -> None:
    own = record.status.get("state")
    if scheduler_state is not None and scheduler_state.split()[0] not in SCHEDULER_FINAL:
        record.state = "RUNNING" if own == "RUNNING" and scheduler_state == "PENDING" else scheduler_state
        return
    if not asked:
        record.state, record.reason = own or "UNKNOWN", "the scheduler could not be asked"
        return
    status = read_json(record.folder / STATUS) or {}  # the job may have finished since it was read
    if status.get("state") in FINAL_STATES:
        record.status, record.state, record.reason = status, status["state"], status.get("reason", "")
        return
    if (record.folder / CANCELLED).exists():
        state, reason = "CANCELLED", "cancelled with hpcdl"
    elif scheduler_state is not None:
        state = SCHEDULER_FINAL[scheduler_state.split()[0]]
        reason = f"ended without a result (Slurm: {scheduler_state})"
    else:
        state, reason = "FAILED", "its process ended without a result"
    write_status(record.folder, state, reason=reason)
    record.status = read_json(record.folder / STATUS) or {}
    record.state, record.reason = state, reason
