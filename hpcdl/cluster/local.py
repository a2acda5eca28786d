"""The local backend: a job is a detached process on this machine that outlives the submitting shell.

Its state comes from the job's own status file and from whether its process
(pid and start time, so a reused pid is not mistaken for it) still runs.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

from hpcdl.plan import JobPlan
from hpcdl.store.files import LOGS
from hpcdl.store.folders import JobRecord

KILL_AFTER_S = 10.0


def _start_ticks(pid: int) -> Optional[str]:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat), if it lives."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    return None if fields[0] == "Z" else fields[19]  # a zombie has ended


class LocalBackend:
    """Detached background processes, one per job."""

    name = "local"

    def check(self, plan: JobPlan, dry_run: bool = False) -> Optional[str]:
        """Nothing to ask a scheduler: the plan's own checks are enough."""
        return None

    def _command(self, plan: JobPlan, folder: Path) -> list[str]:
        python = plan.cluster.python
        return [os.path.expanduser(python or sys.executable), "-u", "-m", "hpcdl.worker", str(folder)]

    def _environment(self, plan: JobPlan) -> dict[str, str]:
        # the GPUs this shell may use are the local job's too (on Slurm, the allocation decides)
        copied = [*plan.exported, "CUDA_VISIBLE_DEVICES"]
        return {**{k: os.environ[k] for k in copied if k in os.environ}, **plan.environment,
                "PYTHONUNBUFFERED": "1"}

    def preview(self, plan: JobPlan, folder: Path) -> str:
        """The command and environment the job would start with."""
        env = self._environment(plan)
        lines = [f"# local job {plan.name!r}: a detached process on this machine", "# environment"]
        lines += [f"{k}={shlex.quote(v)}" for k, v in sorted(env.items())]
        lines += ["# command", shlex.join(self._command(plan, folder))]
        return "\n".join(lines) + "\n"

    def submit(self, plan: JobPlan, folder: Path) -> str:
        """Start the job; returns 'PID:START_TICKS'."""
        logs = folder / LOGS
        logs.mkdir(mode=0o700, exist_ok=True)
        # cwd: functions pickled by reference import from the submitting folder, as sbatch jobs do
        with open(logs / "stdout.log", "ab") as out, open(logs / "stderr.log", "ab") as err:
            process = subprocess.Popen(self._command(plan, folder), cwd=os.getcwd(),
                                       env=self._environment(plan), stdin=subprocess.DEVNULL,
                                       stdout=out, stderr=err, start_new_session=True)
        return f"{process.pid}:{_start_ticks(process.pid) or 0}"

    def live_states(self, records: list[JobRecord]) -> Optional[dict[str, str]]:
        """RUNNING for each job whose process still runs; jobs that are absent have ended."""
        live = {}
        for record in records:
            pid, ticks = (record.backend_id or "0:0").split(":")
            if _start_ticks(int(pid)) == ticks:
                live[record.id] = "RUNNING"
        return live

    def cancel(self, record: JobRecord) -> None:
        """TERM the job's process group, KILL it if it is still there after KILL_AFTER_S."""
        pid, ticks = (record.backend_id or "0:0").split(":")
        pid_number = int(pid)
        if _start_ticks(pid_number) != ticks:
            return
        os.killpg(pid_number, signal.SIGTERM)
        deadline = time.monotonic() + KILL_AFTER_S
        while time.monotonic() < deadline and _start_ticks(pid_number) == ticks:
            time.sleep(0.1)
        if _start_ticks(pid_number) == ticks:
            os.killpg(pid_number, signal.SIGKILL)

    def log_path(self, record: JobRecord, rank: int, stream: str) -> Path:
        """stdout.log or stderr.log of the job (local jobs have one rank)."""
        return record.folder / LOGS / f"{stream}.log"
