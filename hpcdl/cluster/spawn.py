"""The spawn backend: a job is a detached process of this machine known by its pid and host name alone.

It starts jobs as the local backend does (a session of their own, the same command, environment and logs)
but judges them another way: its id is 'PID@HOSTNAME', and a job runs while that pid's command line still
names the job's folder (a pid given to another command since is not the job). On another host it cannot
be judged. It is one module and one profile (hpcdl/conf/cluster/spawn.yaml): nothing else in hpcdl names it.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Optional

from hpcdl.cluster.local import KILL_AFTER_S, LocalBackend
from hpcdl.errors import HpcdlError
from hpcdl.host import end_job_tree
from hpcdl.plan import JobPlan
from hpcdl.store.folders import JobRecord
from hpcdl.store.states import RUNNING
from hpcdl.store.sweeps import runs_under_runner


def _spawned(process: str) -> str:
    """'PID@HOSTNAME' of a process the local backend names 'PID:START_TICKS@HOST_KEY'."""
    return f"{process.split(':')[0]}@{socket.gethostname()}"


def _names_folder(backend_id: str, folder: Path) -> Optional[bool]:
    """Whether the process ``backend_id`` runs with ``folder`` (or its name: a sweep runner's point) among its
    arguments; None on another host."""
    pid, _, host = backend_id.partition("@")
    if host != socket.gethostname():
        return None
    try:
        arguments = Path(f"/proc/{int(pid)}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError):
        return False
    return any(Path(argument.decode(errors="replace")).name == folder.name for argument in arguments if argument)


class SpawnBackend(LocalBackend):
    """Detached processes judged by pid and command line."""

    name = "spawn"

    def submit(self, plan: JobPlan, folder: Path) -> str:
        """Start the job in a session of its own; returns 'PID@HOSTNAME'."""
        return _spawned(super().submit(plan, folder))

    def submit_sweep(self, sweep: Path, points: list[tuple[JobPlan, Path]], parallelism: Optional[int],
                     points_per_task: int) -> tuple[list[str], str]:
        """One detached runner for the points, as the local backend starts it; each point's id is the runner's."""
        ids, runner = super().submit_sweep(sweep, points, parallelism, points_per_task)
        return [_spawned(point) for point in ids], _spawned(runner)

    def live_states(self, records: list[JobRecord]) -> Optional[dict[str, Optional[str]]]:
        """RUNNING for each job whose pid still runs its folder, None for another host's; absent ones ended."""
        live: dict[str, Optional[str]] = {}
        for record in records:
            running = _names_folder(record.backend_id or "", record.folder)
            if running is not False:
                live[record.id] = RUNNING if running else None
        return live

    def cancel(self, record: JobRecord) -> None:
        """TERM the job's process tree (KILL after KILL_AFTER_S); a point of a runner is ended by its runner."""
        if runs_under_runner(record):
            return
        running = _names_folder(record.backend_id or "", record.folder)
        if running is None:
            raise HpcdlError(f"job {record.id} runs on host {(record.backend_id or '').partition('@')[2]!r}: "
                             "cancel it there")
        if running:
            end_job_tree(int((record.backend_id or "").split("@")[0]), KILL_AFTER_S)

    def display_id(self, record: JobRecord) -> str:
        """'PID@HOSTNAME'."""
        return record.backend_id or ""

    def describe(self, backend_id: str) -> str:
        """'spawned process PID'."""
        return f"spawned process {backend_id.split('@')[0]}"


BACKEND = SpawnBackend
