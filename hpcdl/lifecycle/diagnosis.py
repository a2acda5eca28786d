"""Why a job failed, root cause first: the ranks' failure records, what srun or mpirun said of a rank a signal
ended, the ranks' stacks of a hang and NCCL's flight recorder, read into one verdict (``jobs why``).

The root cause is the earliest failure that is not a consequence of another (hpcdl.distributed.failures): a
user's exception, an out-of-memory error, a signal, a silent or hung rank. A collective's timeout or a peer's
"connection closed" is a victim, listed one line each. A rank ended by a signal writes nothing: the local
launcher records it; under srun and mpirun their own lines name it (only the first srun error line: what srun
ends after it, with --kill-on-bad-exit, are victims).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from hpcdl.distributed import failures, stacks
from hpcdl.distributed.flight_recorder import lagging_ranks, missing_ranks, newest_collectives
from hpcdl.errors import HpcdlError
from hpcdl.store.files import HEARTBEAT, HEARTBEATS
from hpcdl.store.folders import read_json

SRUN_ERROR = re.compile(r"^srun: error: (\S+): tasks? ([\d,\-]+): (.+)$")
MPIRUN_NOTICED = re.compile(r"process rank (\d+) with PID (\d+) on node (\S+) exited on signal (\d+) \(([^)]+)\)")
LINE_WIDTH = 160


@dataclass
class Verdict:
    """The root cause (a failure record, or None when none is known) and the other failures, earliest first."""

    root: Optional[dict[str, Any]]
    victims: list[dict[str, Any]] = field(default_factory=list)
    """Every failure but the root: the consequences of another (cause false) and any other cause."""
    groups: list[tuple[list[int], list[list[Any]]]] = field(default_factory=list)
    """The ranks' stacks of the newest request, grouped (biggest group first); empty when none were asked."""
    flight: str = ""
    """What the flight recorder's dumps say of the ranks missing from a collective."""


def _task_ranks(text: str) -> list[int]:
    """srun's task list (``0,2-3``) as ranks."""
    ranks: list[int] = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        ranks.extend(range(int(first), int(last or first) + 1))
    return ranks


def launcher_records(log: str) -> list[dict[str, Any]]:
    """Failures srun or mpirun reported of ranks a signal ended (they wrote none themselves): srun's first error
    line only (the tasks it ended after it are victims), every rank mpirun noticed dying of a signal."""
    found = []
    for line in log.splitlines():
        srun = SRUN_ERROR.match(line.strip())
        if srun is not None:
            host, tasks, what = srun.groups()
            if "exit code" not in what:  # a rank that exited with an error code recorded its failure itself
                found += [{"rank": rank, "host": host, "pid": 0, "how": "signal", "type": "Signal",
                           "message": f"{what} (srun)", "traceback": "", "cause": True, "time": None}
                          for rank in _task_ranks(tasks)]
            break
    for rank, pid, host, number, name in MPIRUN_NOTICED.findall(log):
        found.append({"rank": int(rank), "host": host, "pid": int(pid), "how": "signal", "type": "Signal",
                      "message": f"signal {number} ({name}) (mpirun)", "traceback": "", "cause": True, "time": None})
    return found


def judge(folder: Path, world_size: int, launcher_log: str) -> Verdict:
    """The verdict on the job in ``folder`` from its records, ``launcher_log`` (srun's, mpirun's) and stacks."""
    recorded = failures.records(folder)
    known = {entry["rank"] for entry in recorded}
    extra = [entry for entry in launcher_records(launcher_log) if entry["rank"] not in known]
    everything = recorded + [entry for i, entry in enumerate(extra) if entry["rank"] not in
                             {e["rank"] for e in extra[:i]}]
    for entry in everything:
        if not entry.get("pid"):  # srun and some mpiruns do not say it: the rank's heartbeat does
            beat = _heartbeat(folder, entry["rank"])
            entry["pid"], entry["host"] = beat.get("pid") or 0, entry.get("host") or beat.get("host", "")
    causes = [entry for entry in everything if entry.get("cause")]
    root = causes[0] if causes else (everything[0] if everything else None)
    newest = newest_collectives(folder, world_size)
    if newest and (root is None or not root.get("cause")):  # victims alone: the ranks their collective waited for
        top = max(newest.values())
        told = {entry["rank"] for entry in everything}  # a victim's record: it was in the collective
        late = [_late_rank(folder, rank, *top) for rank in lagging_ranks(newest, world_size) if rank not in told]
        if late:
            everything, root = late + everything, late[0]
    verdict = Verdict(root, [entry for entry in everything if entry is not root])
    found = stacks.answers(folder, world_size)
    if found:
        verdict.groups = stacks.groups(found)
    verdict.flight = missing_ranks(newest, world_size)
    return verdict


def _late_rank(folder: Path, rank: int, collective: int, name: str) -> dict[str, Any]:
    """A cause record for a rank the flight recorder shows missing from the collective the others entered."""
    beat = _heartbeat(folder, rank)
    return {"rank": rank, "host": beat.get("host", ""), "pid": beat.get("pid") or 0, "how": "hang", "type": "Hang",
            "message": f"missing from collective #{collective} ({name}) that the other ranks entered (the flight "
                       "recorder)", "traceback": "", "cause": True, "time": None}


def _heartbeat(folder: Path, rank: int) -> dict[str, Any]:
    """Rank ``rank``'s last heartbeat ({} when there is none or it cannot be read)."""
    try:
        beat = read_json(folder / HEARTBEATS / HEARTBEAT.format(rank=rank))
    except (OSError, ValueError, HpcdlError):
        return {}
    return beat if isinstance(beat, dict) else {}


def _where(entry: dict[str, Any]) -> str:
    parts = [f"rank {entry['rank']}"]
    if entry.get("host"):
        parts.append(f"on {entry['host']}")
    if entry.get("pid"):
        parts.append(f"(pid {entry['pid']})")
    return " ".join(parts)


def _what(entry: dict[str, Any]) -> str:
    message = " ".join(str(entry.get("message") or "").split())
    return f"{entry.get('type') or 'Error'}: {message}" if message else str(entry.get("type") or "Error")


def headline(verdict: Verdict) -> str:
    """One line: the root-cause rank and its error; empty when nothing is known."""
    if verdict.root is None:
        return ""
    line = f"{_where(verdict.root)}: {_what(verdict.root)}"
    return line if len(line) <= LINE_WIDTH else line[:LINE_WIDTH - 3] + "..."


def describe(verdict: Verdict) -> str:
    """The whole verdict: the root cause with its traceback, the victims one line each, the stacks' groups."""
    lines = []
    if verdict.root is not None:
        root = verdict.root
        at = f" at {time.strftime('%H:%M:%S', time.localtime(root['time']))}" if root.get("time") else ""
        kind = "root cause" if root.get("cause") else "first failure (every failure reports a lost peer)"
        lines.append(f"{kind}: {_where(root)}{at}: {_what(root)}")
        if root.get("traceback"):
            lines.append(str(root["traceback"]).rstrip("\n"))
    for title, cause in (("other failures, no consequence of a peer's", True), ("victims", False)):
        told = [entry for entry in verdict.victims if bool(entry.get("cause")) == cause]
        if told:
            lines.append(f"{title} ({len(told)}):")
        for entry in told:
            after = (f" +{entry['time'] - verdict.root['time']:.1f} s"
                     if entry.get("time") and verdict.root and verdict.root.get("time") else "")
            line = f"  {_where(entry)}{after}: {_what(entry)}"
            lines.append(line if len(line) <= LINE_WIDTH else line[:LINE_WIDTH - 3] + "...")
    if verdict.groups:
        lines.append(f"stacks ({len(verdict.groups)} group(s) of identical stacks):")
        hung = {entry["rank"] for entry in [verdict.root, *verdict.victims]
                if entry and entry.get("cause") and entry.get("how") == "hang"}  # the flight recorder's too
        odd = {tuple(ranks) for ranks, _ in stacks.outliers(verdict.groups)} | \
            {tuple(ranks) for ranks, _ in verdict.groups if hung & set(ranks)}
        for ranks, stack in verdict.groups:
            waits = stacks.in_collective(stack)
            top = f"{Path(str(stack[-1][0])).name}:{stack[-1][1]} in {stack[-1][2]}" if stack else "(no frames)"
            label = ("OUTLIER " if tuple(ranks) in odd else "") + f"rank{'s' if len(ranks) > 1 else ''} " + \
                ",".join(map(str, ranks))
            lines.append(f"  {label}: " + (f"waiting in {waits} ({top})" if waits else top))
            if tuple(ranks) in odd:
                lines.append(stacks.format_stack(stack))
    if verdict.flight:
        lines.append(verdict.flight)
    return "\n".join(lines)
