"""A job's state: its own final word first, the scheduler for what the job could not say.

A job without a scheduler id is still being submitted (SUBMITTING), or its
submitter died before the backend answered. A job that the scheduler no longer
runs and that recorded no final state ended without a result (killed, out of
memory, node lost): it is FAILED, or what the scheduler says it was (TIMEOUT,
CANCELLED, ...), even where Slurm says COMPLETED (hydra#1928). A job the
scheduler cannot be asked about from here (Slurm down, a local job of another
host) shows its last recorded state. Final states are recorded once (final.json,
first writer wins); a store this user cannot write is still listed.
"""

from __future__ import annotations

from collections import defaultdict

from hpcdl.cluster import backend_for
from hpcdl.errors import FolderGoneError, HpcdlError
from hpcdl.host import is_running
from hpcdl.store.folders import JobRecord, load_record
from hpcdl.store.states import (DAMAGED, FAILED, INTERRUPTED, PENDING, QUEUED_AGAIN, REQUEUED, RUNNING,
                                SCHEDULER_FINAL, SUBMITTING, UNKNOWN)
from hpcdl.store.status import write_final
from hpcdl.store.sweeps import (is_sweep, load_points, runs_under_runner, settle, submission_state,
                                sweep_id_of)


def resolve_states(records: list[JobRecord]) -> None:
    """Set ``state`` and ``reason`` of every record: one scheduler query per backend in all.

    A sweep's state is its points' (those not among ``records`` are read from the store).
    """
    sweeps = [r for r in records if is_sweep(r) and r.state != DAMAGED]
    _resolve_jobs([r for r in records if not is_sweep(r)])
    known = {r.id: r for r in records}
    for sweep in sweeps:
        resolve_sweep(sweep, known)


def resolve_sweep(sweep: JobRecord, known: dict[str, JobRecord]) -> list[JobRecord]:
    """Set the state of ``sweep`` from its points' and return them (those not in ``known`` read from the store
    and resolved); none, and the sweep DAMAGED, when they cannot be read. A sweep being submitted, or whose
    submission was interrupted, is that (its points are not read)."""
    submission = submission_state(sweep)
    if submission is not None:
        sweep.state = submission
        sweep.reason = "" if submission != INTERRUPTED else (
            f"its submission was interrupted; none of its points runs: python -m hpcdl.jobs cancel {sweep.id} "
            "removes it")
        return []
    try:
        points, loaded = load_points(sweep, known)
    except (OSError, ValueError, HpcdlError) as e:
        sweep.state, sweep.reason = DAMAGED, f"its points cannot be read: {e}"
        return []
    _resolve_jobs(loaded)
    settle(sweep, points)
    return points


def _resolve_jobs(records: list[JobRecord]) -> None:
    open_records: dict[str, list[JobRecord]] = defaultdict(list)
    for record in records:
        if not record.final and not (record.backend_id is None and _still_submitting(record)):
            open_records[record.backend].append(record)
    for backend, group in open_records.items():
        live = backend_for(backend).live_states(group)
        for record in group:
            if live is None:
                _last_recorded(record, "the scheduler could not be asked")
            elif record.id in live and live[record.id] is None:
                _last_recorded(record, "it runs on another host (or PID namespace) and is judged only there")
            else:
                _resolve(record, live.get(record.id))


def _last_recorded(record: JobRecord, why: str) -> None:
    record.state = record.status.get("state") or UNKNOWN
    record.reason = f"as last recorded: {why}"


def _still_submitting(record: JobRecord) -> bool:
    """True, with the state set, for a job its backend has not taken yet: SUBMITTING while its submitter runs."""
    submitter = record.manifest.get("submitted_from", {}).get("process")
    if submitter is None or is_running(submitter) is not False:
        record.state, record.reason = record.status.get("state") or SUBMITTING, ""
        return True
    fresh = load_record(record.folder)  # the submitter may have written the id just before it exited
    if fresh is not None and fresh.backend_id is not None:
        record.manifest = fresh.manifest
        return False
    if record.status:
        _last_recorded(record, "its submitter ended before it recorded the scheduler's id")
    elif sweep_id_of(record) is not None:  # never runs; its sweep names it and removes it (nothing recorded)
        record.state, record.reason = INTERRUPTED, f"the submission of sweep {sweep_id_of(record)} was interrupted"
    else:
        _settle(record, FAILED, "its submission was interrupted before the scheduler took the job")
    return True


def _resolve(record: JobRecord, scheduler_state: str | None) -> None:
    own = record.status.get("state")
    if scheduler_state is not None and scheduler_state.split()[0] not in SCHEDULER_FINAL:
        state, _, detail = scheduler_state.partition(" ")  # 'PENDING Resources': why it waits
        if state == RUNNING and own is None and runs_under_runner(record):
            state, detail = PENDING, "a runner slot"  # its runner runs, the point waits for a slot
        record.state, record.waiting_for = state, detail
        if own in (RUNNING, REQUEUED) and state in QUEUED_AGAIN:
            record.reason = "queued again: it goes on from its newest checkpoint"
        return
    if scheduler_state is not None:
        _settle(record, SCHEDULER_FINAL[scheduler_state.split()[0]],
                f"ended without a result (Slurm: {scheduler_state})")
    else:
        _settle(record, FAILED, "its process ended without a result")


def _settle(record: JobRecord, state: str, reason: str) -> None:
    """Record a final state the job did not record itself, unless it has done so meanwhile. A folder that cannot
    be reached just now (a parent renamed away and back) concludes nothing: the last recorded state is shown."""
    try:
        won = write_final(record.folder, state, reason=reason)
    except FolderGoneError:
        _last_recorded(record, "its folder could not be reached just now")
        return
    except OSError:  # a store this user may only read: show it, record nothing
        won = True
    fresh = None if won else load_record(record.folder)
    if fresh is not None and fresh.final:
        record.status, record.state, record.reason = fresh.status, fresh.state, fresh.reason
    elif not won:  # a final state is recorded but could not be read again just now
        _last_recorded(record, "its folder could not be reached just now")
    else:
        record.state, record.reason = state, reason
