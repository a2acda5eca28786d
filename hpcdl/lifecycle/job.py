"""Jobs: submit a training run or a function to a cluster profile, and come back to it later.

``Job.attach(id)`` works from any process and any shell: everything a Job knows
comes from its folder in the store and from the scheduler.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Optional

from hpcdl.cluster import backend_for
from hpcdl.errors import HpcdlError, JobFailedError
from hpcdl.lifecycle.diagnosis import Verdict, judge
from hpcdl.store.files import FUNCTION_RESULT, LOGS, RESULT, rank_result, stream_log
from hpcdl.store.folders import DAMAGED, JobRecord, load_record, read_json
from hpcdl.store.listing import find
from hpcdl.store.safety import load_pickle, read_job_file
from hpcdl.lifecycle.states import resolve_states, resolve_sweep
from hpcdl.store.states import CANCELLED, COMPLETED, INTERRUPTED
from hpcdl.store.status import withdraw_final, write_final, write_finals
from hpcdl.store.atomic import create_once
from hpcdl.store.files import CANCELLED_MARK
from hpcdl.store.sweeps import is_sweep, remove_interrupted, settle

POLL_S = 1.0


class Job:
    """A submitted job: its id, state, logs and result, from any process."""

    def __init__(self, record: JobRecord) -> None:
        self._record = record

    @classmethod
    def attach(cls, key: str) -> "Job":
        """The job whose id (or unique prefix, or scheduler id, or 'last') is ``key``."""
        return cls(find(key))

    @property
    def id(self) -> str:
        """hpcdl's job id (also the folder name in the store)."""
        return self._record.id

    @property
    def folder(self) -> Path:
        """The job's folder in the store."""
        return self._record.folder

    @property
    def backend_id(self) -> Optional[str]:
        """The scheduler's id (Slurm job id), or PID:START for local jobs."""
        return self._record.backend_id

    @property
    def manifest(self) -> dict[str, Any]:
        """What was submitted: profile, resolved config, overrides, time, git commit."""
        return self._record.manifest

    def refresh(self) -> JobRecord:
        """Re-read the folder and ask the scheduler; returns the fresh record."""
        record = load_record(self.folder)
        if record is None:
            raise HpcdlError(f"{self.folder}: the job's manifest is gone")
        resolve_states([record])
        self._record = record
        return record

    @property
    def state(self) -> str:
        """SUBMITTING, PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, TIMEOUT, DAMAGED, ... (asked afresh)."""
        return self.refresh().state

    @property
    def last_seen_state(self) -> str:
        """The state as this handle last read or set it (nothing read now)."""
        return self._record.state

    def done(self) -> bool:
        """True once the job has reached a final state."""
        return self.refresh().final

    def wait(self, timeout: Optional[float] = None, poll_s: float = POLL_S) -> str:
        """Block until the job ends (or ``timeout`` seconds pass); returns the state."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.done():
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"job {self.id} still {self._record.state} after {timeout} s")
            time.sleep(poll_s)
        return self._record.state

    def log_path(self, rank: int = 0, stream: str = "stdout") -> Path:
        """Where rank ``rank``'s stdout or stderr is written."""
        return backend_for(self._record.backend).log_path(self._record, rank, stream)

    def logs(self, rank: int = 0, stream: str = "stdout") -> str:
        """Rank ``rank``'s stdout or stderr so far."""
        data = read_job_file(self.folder, self.log_path(rank, stream).relative_to(self.folder))
        return "" if data is None else data.decode(errors="replace")

    def error(self) -> str:
        """Why the job failed: the root-cause rank's own error first (which rank, on which host, the user's
        exception and traceback; see verdict), then what the scheduler said of failed tasks (srun names a lost
        rank); rank 0's stderr tail when no rank recorded a traceback, the job's own (its launcher's, as mpirun
        refusing to start) where rank 0 wrote nothing."""
        said = self.logs(0, "stderr")
        if not said.strip() and self.log_path(0, "stderr") != self.folder / LOGS / stream_log("stderr"):
            said = (read_job_file(self.folder, Path(LOGS) / stream_log("stderr")) or b"").decode(errors="replace")
        stderr = "\n".join(said.splitlines()[-200:])
        tasks = "\n".join(line for line in stderr.splitlines() if line.startswith("srun: error:"))
        root = self.verdict().root
        own = failing_rank({"rank": root["rank"], "rank_host": root.get("host"), "traceback": root["traceback"]}) \
            if root is not None and root.get("traceback") else failing_rank(self._record.status)
        return "\n".join(part for part in (own or "\n".join(stderr.splitlines()[-30:]), tasks) if part)

    def verdict(self) -> Verdict:
        """Which rank's failure is the root cause and which are its victims, with the ranks' stacks of a hang
        (hpcdl.lifecycle.diagnosis)."""
        logs = [self.log_path(0, "stderr").relative_to(self.folder), Path(LOGS) / stream_log("stderr")]
        said = "\n".join(dict.fromkeys((read_job_file(self.folder, log) or b"").decode(errors="replace")
                                       for log in logs))
        return judge(self.folder, self._record.plan.get("world_size", 1), said)

    def cancel(self) -> bool:
        """Cancel the job (no-op once it has ended): CANCELLED is recorded first, so that no rank ending
        on the way (killed, failing, or completing) records anything else. A sweep: each point that has
        not ended, and its arrays (or runner); a sweep whose submission was interrupted is removed from the
        store (what the scheduler has of it ended first): True then."""
        if is_sweep(self._record):
            return self._cancel_sweep()
        if self.done() or not write_final(self.folder, CANCELLED, reason="cancelled with hpcdl"):
            return False
        if self._record.backend_id is None:  # still being submitted: the job finds CANCELLED when it starts
            return False
        try:
            backend_for(self._record.backend).cancel(self._record)
        except BaseException:
            withdraw_final(self.folder)
            raise
        return False

    def _cancel_sweep(self) -> bool:
        """CANCELLED for each point not ended yet, then the sweep's arrays (or runner) and any point resubmitted
        on its own are ended; if the scheduler refuses, the points' CANCELLED is withdrawn. A mark in the
        sweep's folder makes its sweeper's later batches refused."""
        record = load_record(self.folder)
        if record is None:
            raise HpcdlError(f"{self.folder}: the job's manifest is gone")
        points = resolve_sweep(record, {})  # each point read once: a sweep may have 10,000
        self._record = record
        create_once(record.folder / CANCELLED_MARK, f"{time.time()}\n")
        handed = [h for h in (record.backend_id or "").split(",") if h]
        backend = backend_for(record.backend)
        if record.state == INTERRUPTED:
            for part in handed:
                backend.cancel(JobRecord(record.folder, {**record.manifest, "backend_id": part}, record.status))
            remove_interrupted(record)
            return True
        if record.final:
            return False
        reason = f"sweep {record.id} cancelled with hpcdl"
        won = set(write_finals(record.folder.parent, [p.id for p in points if not p.final], CANCELLED, reason=reason))
        marked = [p for p in points if p.id in won]
        try:
            for part in handed:
                backend.cancel(JobRecord(record.folder, {**record.manifest, "backend_id": part}, record.status))
            for point in marked:  # resumed on its own (jobs resume): not under the sweep's arrays or runner
                if point.backend_id and point.backend_id not in handed \
                        and point.backend_id.split("_")[0] not in handed:
                    backend.cancel(point)
        except BaseException:
            for point in marked:
                withdraw_final(point.folder)
            raise
        for point in marked:  # what was just written, not read again: a sweep may have 10,000 points
            point.state, point.reason = CANCELLED, reason
        for n, point in enumerate(points):  # its own final state came first: read it again
            if not point.final:
                points[n] = load_record(point.folder) or point
        resolve_states([p for p in points if not p.final])
        settle(record, points)
        return False

    def result(self, timeout: Optional[float] = None) -> Any:
        """Wait, then return the result: the training summary, or the function's return value.

        Raises JobFailedError (with the traceback or stderr tail) if the job did not complete.
        Function results are unpickled only from a file and folder owned by this user alone, opened once
        without following links (hpcdl.store.safety).
        """
        state = self.wait(timeout)
        if state == DAMAGED:
            raise HpcdlError(f"job {self.id}: its record in {self.folder} is damaged: {self._record.reason}")
        if state != COMPLETED:
            raise JobFailedError(f"job {self.id} ended {state}: {self._record.reason}", self.error())
        if self.manifest["kind"] == "train":
            return read_json(self.folder / RESULT)
        if self._record.plan.get("gather_results"):
            return [load_pickle(self.folder, rank_result(rank))
                    for rank in range(self._record.plan["world_size"])]
        return load_pickle(self.folder, FUNCTION_RESULT)

    def __repr__(self) -> str:
        return f"Job({self.id!r}, backend_id={self.backend_id!r}, state={self._record.state!r})"


def failing_rank(status: dict[str, Any]) -> str:
    """The failure a rank recorded: 'rank R on HOST:' and its traceback (the user's own, for their code); empty
    when none was recorded."""
    traceback = status.get("traceback")
    if not isinstance(traceback, str) or not traceback:
        return ""
    rank, host = status.get("rank"), status.get("rank_host")
    where = " ".join(part for part in ("" if rank is None else f"rank {rank}", f"on {host}" if host else "") if part)
    return f"{where}:\n{traceback}" if where else traceback
