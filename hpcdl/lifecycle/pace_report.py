"""A job's pace in words: each rank's speed against the median rank with the stragglers flagged (jobs show,
jobs watch), and its effective training time with the time lost named by cause (jobs show)."""

from __future__ import annotations

import time
from hpcdl.store.folders import JobRecord
from hpcdl.store.pace import RankPace, goodput, rank_paces, read_pace
from hpcdl.store.states import RUNNING

DEFAULT_MARGIN, DEFAULT_WINDOW_S = 0.2, 300
"""For jobs submitted before the profile had straggler_margin and straggler_window_s."""

def _limits(record: JobRecord) -> tuple[float, float]:
    cluster = record.plan.get("cluster") or {}
    return cluster.get("straggler_margin", DEFAULT_MARGIN), cluster.get("straggler_window_s", DEFAULT_WINDOW_S)

def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.0f} s"

def straggler_words(view: RankPace, margin: float) -> str:
    """'STRAGGLER: 48% slower than the median rank for 6.0 min (margin 20%)'."""
    return (f"STRAGGLER: {100 * (1 / view.relative - 1):.0f}% slower than the median rank for "
            f"{_minutes(view.slow_for_s)} (margin {100 * margin:.0f}%)")

def pace_lines(record: JobRecord, now: float | None = None) -> list[str]:
    """jobs show's lines: the ranks' pace (several ranks) and the effective training time (once a run started)."""
    paces = read_pace(record.folder)
    if not paces:
        return []
    margin, window = _limits(record)
    lines = []
    views = rank_paces(paces, margin, window)
    if len(views) > 1:
        lines.append(f"pace      over the last {_minutes(window)} of the newest run; own = a step less its "
                     "backward and gradient exchange (where ranks wait for slower peers)")
        for view in views:
            flag = f"  {straggler_words(view, margin)}" if view.straggler else ""
            lines.append(f"  rank {view.rank:<4d} {view.host:<12s} {view.steps_per_s:8.2f} steps/s  own "
                         f"{1000 * view.own_s:8.2f} ms  {view.relative:5.2f}x median  data wait "
                         f"{100 * view.wait_share:3.0f}%{flag}")
    lead = paces.get(record.plan.get("lead_rank", 0), [])
    result = goodput(lead, record.status.get("events", []), now or time.time(), record.state == RUNNING)
    if result.wall_s > 0:
        lines.append(f"effective {100 * result.share:.1f}% training time: {_minutes(result.productive_s)} of "
                     f"{_minutes(result.wall_s)} since the first start (queue wait before it not counted)")
        lines += [f"  lost    {_minutes(seconds):>9s}  {cause}" for cause, seconds in result.lost]
    return lines

def straggler_flags(record: JobRecord) -> str:
    """jobs watch's words on the ranks: '' for a job of one rank or before their first samples."""
    paces = read_pace(record.folder)
    margin, window = _limits(record)
    views = rank_paces(paces, margin, window) if len(paces) > 1 else []
    if len(views) < 2:
        return ""
    slowest = min(views, key=lambda view: view.relative)
    flags = [f"rank {v.rank} ({v.host}) {straggler_words(v, margin)}" for v in views if v.straggler]
    return "; ".join(flags) or f"ranks at {slowest.relative:.2f}x..{max(v.relative for v in views):.2f}x median"
