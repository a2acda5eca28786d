"""This host's processes: who they are (host key, pid, start time) and ending a whole session of them.

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
from pathlib import Path
from typing import Optional


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


def session_members(session: int) -> list[int]:
    """The live processes of session ``session`` (a local job's: its launcher, ranks, mpirun, children)."""
    return [pid for pid, (_, sid) in _processes().items() if sid == session]


def signal_session(session: int, signum: int) -> None:
    """Send ``signum`` to every live process of ``session`` but this one."""
    for pid in session_members(session):
        if pid != os.getpid():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)


def _own_job() -> list[int]:
    """The other processes of this job: its session when it leads one (as a local job does), else its descendants."""
    me, processes = os.getpid(), _processes()
    if os.getsid(0) == me:
        return [pid for pid, (_, sid) in processes.items() if sid == me and pid != me]
    found, frontier = [], [me]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, (ppid, _) in processes.items() if ppid == parent]
        found += children
        frontier += children
    return found


def end_own_job(code: int) -> None:
    """Kill every other process of this job (ranks, mpirun, their children), then exit with ``code``."""
    for _ in range(10):  # a child forked meanwhile is caught by the next pass
        others = _own_job()
        if not others:
            break
        for pid in others:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    os._exit(code)
