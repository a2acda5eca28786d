"""Reading the ranks' pace files (hpcdl.distributed.pace): each rank's speed against the median rank, the
stragglers, and the job's effective training time with its lost time named by cause."""

from __future__ import annotations

import json
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from hpcdl.store.files import PACE, PACE_RANK
from hpcdl.store.safety import read_job_file

SLOW_SHARE = 0.8
"""A straggler's samples over its window: at least this share of them slower than the margin allows."""
_RANK_FILE = re.compile("^" + re.escape(PACE_RANK).replace(r"\{rank\}", r"(\d{1,6})") + "$")


def read_pace(folder: Path) -> dict[int, list[dict[str, Any]]]:
    """Every rank's pace lines (JSON objects with a run and a time; others skipped), by rank."""
    found: dict[int, list[dict[str, Any]]] = {}
    pace = folder / PACE
    for name in sorted(p.name for p in pace.iterdir()) if pace.is_dir() else ():
        match = _RANK_FILE.match(name)
        data = read_job_file(folder, f"{PACE}/{name}") if match else None
        if data is None:
            continue
        lines = []
        for text in data.decode(errors="replace").splitlines():
            try:
                line = json.loads(text)
            except ValueError:
                continue
            if isinstance(line, dict) and isinstance(line.get("run"), str) and _number(line.get("at")):
                lines.append(line)
        found[int(match.group(1))] = lines
    return found


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass
class RankPace:
    """One rank's pace over the last straggler window of its run."""

    rank: int
    host: str
    steps_per_s: float
    own_s: float
    """Seconds per step of the rank's own work: the step less the backward and gradient exchange (where a rank
    waits for slower peers); the whole step where the exchange is not marked (your own code)."""
    relative: float = 1.0
    """The median rank's (the faster middle one of an even count) own time over this rank's: 1.0 as fast as the median, 0.5 twice as slow."""
    wait_share: float = 0.0
    """Share of the step time spent waiting for input data."""
    slow_for_s: float = 0.0
    """How long the rank has been slower than the margin allows, up to its last sample."""
    straggler: bool = False


def rank_paces(paces: dict[int, list[dict[str, Any]]], margin: float, window_s: float) -> list[RankPace]:
    """Each rank's pace over the last ``window_s`` of the newest run, relative to the median rank; a rank whose
    own time per step has exceeded the median's by more than ``margin`` for ``window_s`` is a straggler."""
    run = _newest_run(paces)
    samples = {rank: [s for s in lines if s["run"] == run and _is_sample(s)] for rank, lines in paces.items()}
    samples = {rank: found for rank, found in samples.items() if found}
    if not samples:
        return []
    end = max(found[-1]["at"] for found in samples.values())
    views = []
    for rank, found in sorted(samples.items()):
        recent = [s for s in found if s["at"] >= end - window_s] or found[-1:]
        steps = sum(s["timed"] for s in recent)
        span = sum(s["timed"] * s["step_s"] for s in recent)
        own = sum(s["timed"] * _own(s) for s in recent) / steps
        host = next((line.get("host") for line in paces[rank] if line["run"] == run and line.get("host")), "?")
        views.append(RankPace(rank, str(host), steps / span if span else 0.0, own,
                              wait_share=sum(s["wait_s"] for s in recent) / span if span else 0.0))
    median = statistics.median_low(view.own_s for view in views)  # of two ranks: the faster
    for view in views:
        view.relative = median / view.own_s if view.own_s > 0 else 1.0
        view.slow_for_s = _slow_for(samples[view.rank], (1 + margin) * median)
        view.straggler = view.slow_for_s >= window_s and view.relative < 1 / (1 + margin)
    return views


def _slow_for(found: list[dict[str, Any]], limit: float) -> float:
    """Seconds up to the last sample over which at least SLOW_SHARE of the samples took more than ``limit``
    per step of own time (a sample of a validation or of the end may fall below it)."""
    slow = total = 0
    since = None
    for number in range(len(found) - 1, -1, -1):
        total += 1
        slow += _own(found[number]) > limit
        if slow >= SLOW_SHARE * total and _own(found[number]) > limit:
            since = found[number - 1]["at"] if number else found[number]["at"]
    return found[-1]["at"] - since if since is not None else 0.0


def _is_sample(line: dict[str, Any]) -> bool:
    """A sample of steps (others, and lines of the wrong shape in a damaged file, are left out)."""
    return all(_number(line.get(key)) for key in ("step_s", "timed", "wait_s")) and line["timed"] > 0


def _own(sample: dict[str, Any]) -> float:
    exchange = sample.get("exchange_s")
    return max(sample["step_s"] - exchange, 0.0) if _number(exchange) else sample["step_s"]


def _newest_run(paces: dict[int, list[dict[str, Any]]]) -> Optional[str]:
    newest = max((line for lines in paces.values() for line in lines), key=lambda line: line["at"], default=None)
    return newest["run"] if newest else None


@dataclass
class Goodput:
    """A job's effective training time: the time its steps ran and were kept, over the wall time from its first
    start to its end (or now), with the rest named by cause."""

    wall_s: float
    productive_s: float
    lost: list[tuple[str, float]] = field(default_factory=list)

    @property
    def share(self) -> float:
        return self.productive_s / self.wall_s if self.wall_s > 0 else 0.0


@dataclass
class _Run:
    token: str
    start: float
    end: float
    first_step: Optional[float] = None
    last_step: Optional[float] = None
    samples: list[tuple[float, int]] = field(default_factory=list)
    """(time, steps of this run so far) of each sample."""
    ended: bool = False


def _runs(lines: list[dict[str, Any]]) -> list[_Run]:
    runs: dict[str, _Run] = {}
    for line in lines:
        run = runs.setdefault(line["run"], _Run(line["run"], line["at"], line["at"]))
        run.end = max(run.end, line["at"])
        if line.get("event") == "end":
            run.ended = True
        if _number(line.get("first_step_at")):
            run.first_step = line["first_step_at"]
        if isinstance(line.get("steps"), int):
            run.samples.append((line["at"], line["steps"]))
            run.last_step = line["at"]
    return sorted(runs.values(), key=lambda run: run.start)


def goodput(lead: list[dict[str, Any]], events: list[dict[str, Any]], now: float, running: bool) -> Goodput:
    """The effective training time from the lead rank's pace lines ``lead`` and the job's events (status.json:
    requeued, restarted with Slurm's word on the run before); ``running``: the newest run goes on until ``now``."""
    runs = _runs(lead)
    if not any(run.first_step is not None for run in runs):  # no step noted (a script's own process): unknown
        return Goodput(0.0, 0.0)
    if running:
        runs[-1].end = now
    lost: dict[str, float] = {}
    productive, begun_at = 0.0, 0

    def book(cause: str, seconds: float) -> None:
        if seconds > 0:
            lost[cause] = lost.get(cause, 0.0) + seconds

    for number, run in enumerate(runs):
        later = runs[number + 1] if number + 1 < len(runs) else None
        event = _event_between(events, run.end, later.start) if later else None
        if run.first_step is None:
            book("start-up without a step" if number == 0 else "restart without a step", run.end - run.start)
        else:
            book("start-up (imports, data, first step)" if number == 0 else
                 "restart start-up (checkpoint load, first step)", run.first_step - run.start)
            kept_until = run.last_step or run.first_step
            if event is not None and isinstance(event.get("iteration"), int) and run.samples:
                kept = event["iteration"] - begun_at  # steps of this run the next one goes on from
                kept_until = next((at for at, steps in run.samples if steps >= kept), kept_until)
                book(f"work redone after {_cause(event)}", (run.last_step or kept_until) - kept_until)
                begun_at = event["iteration"]
            productive += max(kept_until - run.first_step, 0.0)
            book("after the last step (validation, saving, exit)", run.end - (run.last_step or run.end))
        if later is not None:
            book(f"held between runs: {_cause(event) if event else 'stopped until resumed'}", later.start - run.end)
    wall = runs[-1].end - runs[0].start
    return Goodput(wall, productive, sorted(lost.items(), key=lambda item: -item[1]))


def _event_between(events: list[dict[str, Any]], end: float, start: float) -> Optional[dict[str, Any]]:
    """The job's event that ended one run and led to the next (the first from a minute before ``end`` to a minute
    after ``start``: a restart is noted as the next run starts)."""
    found = [e for e in events if _number(e.get("at")) and end - 60 <= e["at"] <= start + 60]
    return found[0] if found else None


def _cause(event: dict[str, Any]) -> str:
    if event.get("event") == "restarted":
        return f"restart by Slurm ({event.get('slurm', 'unknown')})"
    if event.get("event") == "requeued":
        return "requeue at the stop signal (time limit or preemption)"
    return str(event.get("event", "an event"))
