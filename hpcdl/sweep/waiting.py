"""Waiting for a sweep's points: whether the sweeper needs their results, and following them until they end.

A sweeper other than Hydra's basic one (Optuna, Nevergrad, Ax, ...) reads each point's return value, so the
launcher waits for it unless told not to, which such a sweeper refuses. A point's end is seen in its folder
(final.json, written after its result): looked at often at first, then within a twentieth of the time waited;
the scheduler is asked every ``poll_s`` for points that ended without saying so (killed, node lost).
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any, Iterator, Optional

from hpcdl.errors import ConfigError
from hpcdl.store.files import FINAL
from hpcdl.store.folders import JobRecord, load_record

log = logging.getLogger(__name__)

BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"
"""Hydra's default sweeper, as its config names it (hydra.sweeper._target_): it needs no point's result."""
FIRST_LOOK_S = 0.05
"""Seconds between the first looks at the points' folders."""


def waits_for_results(wait: Optional[bool], sweeper_target: str) -> bool:
    """Whether the launcher follows the points: ``wait`` if set, else when the sweeper needs their values;
    ConfigError for ``wait=false`` under such a sweeper (its trials would all fail, still running)."""
    needs_results = sweeper_target != BASIC_SWEEPER
    if wait is False and needs_results:
        raise ConfigError(f"hydra.launcher.wait=false: the sweeper {sweeper_target} needs each point's return "
                          "value; set hydra.launcher.wait=true (or leave it unset); nothing was submitted")
    return needs_results if wait is None else wait


@contextlib.contextmanager
def cancelled_if_interrupted(sweep_folder: Path, waiting: bool) -> Iterator[None]:
    """While a waiting launcher has points out: interrupted (Ctrl-C, an error), it cancels the sweep, so that no
    point runs on unseen after its sweeper ended."""
    try:
        yield
    except BaseException:
        sweep = load_record(sweep_folder) if waiting else None
        if sweep is not None:
            from hpcdl.lifecycle.job import Job

            print(f"cancelling sweep {sweep.id}: its points that have not ended", file=sys.stderr, flush=True)
            Job(sweep).cancel()
        raise


def follow_points(records: list[JobRecord], poll_s: float) -> list[JobRecord]:
    """Wait until every point has ended; their fresh records, in order."""
    from hpcdl.lifecycle.states import resolve_states

    fresh = list(records)
    started = asked = time.monotonic()
    said = ""
    while True:
        fresh = [load_record(r.folder) or r if not r.final and (r.folder / FINAL).exists() else r for r in fresh]
        if all(r.final for r in fresh):
            _say_counts(fresh, said)
            return fresh
        now = time.monotonic()
        if now - asked >= poll_s:
            fresh = [r if r.final else load_record(r.folder) or r for r in fresh]
            resolve_states([r for r in fresh if not r.final])
            said, asked = _say_counts(fresh, said), now
            continue
        time.sleep(min(poll_s, max(FIRST_LOOK_S, (now - started) / 20)))


def _say_counts(points: list[JobRecord], said: str) -> str:
    """Log how many points have ended and the count of each state, unless ``said`` (the counts logged last)
    is the same; returns the counts."""
    counts = ", ".join(f"{n} {s}" for s, n in sorted(Counter(r.state for r in points).items()))
    if counts != said:
        log.info(f"sweep points: {sum(r.final for r in points)} of {len(points)} done ({counts})")
    return counts


def sweeper_target(config: Any) -> str:
    """The ``_target_`` of the sweeper in a Hydra app's config."""
    return str(config.hydra.sweeper.get("_target_", BASIC_SWEEPER))
