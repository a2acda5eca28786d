"""This host's processes: who they are (host key, pid, start time), the CPUs they may use, and ending a whole
session of them.

A pid means something only on the host, boot and PID namespace that gave it out:
``host_key()`` names those three, so that a process recorded elsewhere (another
login node, a container) is never judged by this host's /proc.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import signal
import socket
import time
from pathlib import Path
from typing import Optional

TASK_CPUS = "HPCDL_TASK_CPUS"
"""Set in a job's ranks to the CPUs its scheduler gave the task, where it gives a count (Backend.task_cpus)."""


def usable_cpus() -> int:
    """The CPUs this process may use: those its scheduler gave the task, else its affinity mask's."""
    given = os.environ.get(TASK_CPUS)
    if given:
        return int(given)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@functools.lru_cache(maxsize=1)
def host_key() -> str:
    """hostname/boot id/PID namespace inode: equal only where this host's pids mean the same processes."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        namespace = str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:  # a sandbox that hides them: pids are still judged only where they were given out
        boot, namespace = "?", str(os.getpid())
    return f"{socket.gethostname()}/{boot}/{namespace}"


def host_tag() -> str:
    """A short fixed-width digest of ``host_key()``, for file names."""
    return hashlib.sha256(host_key().encode()).hexdigest()[:8]


def _stat_fields(pid: int) -> Optional[list[str]]:
    """The fields of /proc/PID/stat after the command name (state first), or None when it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None


def start_ticks(pid: int) -> Optional[str]:
    """The process's start time in clock ticks since boot, if it lives (a zombie has ended)."""
    fields = _stat_fields(pid)
    return None if fields is None or fields[0] == "Z" else fields[19]


def alive(pid: int) -> bool:
    """True while a process ``pid`` of this host (not a zombie) exists."""
    return pid > 0 and start_ticks(pid) is not None


def process_id(pid: int) -> Optional[str]:
    """'PID:START_TICKS@HOST_KEY' of a live process: no other host, namespace or later process matches it."""
    ticks = start_ticks(pid)
    return None if ticks is None else f"{pid}:{ticks}@{host_key()}"


def is_running(process: str) -> Optional[bool]:
    """Whether the process that ``process_id`` named still runs; None when it is another host's to say."""
    number, _, where = process.partition("@")
    if where != host_key():
        return None
    pid, _, ticks = number.partition(":")
    return start_ticks(int(pid)) == ticks


def _processes() -> dict[int, tuple[int, int]]:
    """Every live process of this PID namespace: pid -> (parent pid, session id)."""
    found = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            fields = _stat_fields(int(entry.name))
            if fields is not None and fields[0] != "Z":
                found[int(entry.name)] = (int(fields[1]), int(fields[3]))
    return found


def become_subreaper() -> None:
    """Make this process (a local job's top process) the one its orphaned descendants are re-parented to, not
    init: a child that detached (setsid) and lost its parent stays in the job's tree (job_tree), to be ended
    with the job, as Slurm's cgroups end a job's every process. Linux only; elsewhere nothing changes."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER


def job_tree(leader: int) -> list[int]:
    """The live processes of the local job whose top process is ``leader``: its session (its launcher, ranks,
    mpirun) and every descendant of those, sessions of their own included (become_subreaper keeps them below it)."""
    processes = _processes()
    found = {pid for pid, (_, sid) in processes.items() if sid == leader}
    if leader in processes:
        found.add(leader)
    frontier = list(found)
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, (ppid, _) in processes.items() if ppid == parent and pid not in found]
        found.update(children)
        frontier += children
    return sorted(found)


def end_job_tree(leader: int, grace_s: float) -> None:
    """TERM every process of the job (job_tree), KILL those still there after ``grace_s``. Each process seen is
    remembered (with its start time): one whose parent ended meanwhile is still found and killed."""
    seen: dict[int, Optional[str]] = {}

    def look() -> list[int]:
        for pid in job_tree(leader):
            seen.setdefault(pid, start_ticks(pid))
        return [pid for pid, ticks in seen.items() if ticks is not None and start_ticks(pid) == ticks]

    for signum, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 1.0)):
        for pid in look():
            if pid != os.getpid():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signum)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and [pid for pid in look() if pid != os.getpid()]:
            time.sleep(0.1)


def end_own_job(code: int) -> None:
    """Kill every other process of this job (ranks, mpirun, their children, detached ones), then exit with
    ``code``."""
    for _ in range(10):  # a child forked meanwhile is caught by the next pass
        others = [pid for pid in job_tree(os.getpid()) if pid != os.getpid()]
        if not others:
            break
        for pid in others:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    os._exit(code)
