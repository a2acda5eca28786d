"""A run's views kept up to date by a thread of their own: the training loop only asks (sets an event), the
thread redraws the plot and appends TensorBoard events from the records, so no step waits for either."""

from __future__ import annotations

import sys
import threading
import time
from typing import Callable


MIN_INTERVAL_S = 10.0
"""The least time between two updates: requests in between fold into the next (on a CPU run the drawing takes
the cores the training uses)."""


class LiveViews:
    """Runs ``update`` in a background thread whenever asked (requests that come while it runs, or less than
    ``min_interval_s`` after it began, fold into one more run), and once more in the caller's thread on
    ``close``."""

    def __init__(self, update: Callable[[], None], name: str = "hpcdl-views",
                 min_interval_s: float = MIN_INTERVAL_S) -> None:
        self.update, self.min_interval_s = update, min_interval_s
        self.ending = threading.Event()
        self.asked, self.closing = threading.Event(), False
        self.failed = False
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def request(self) -> None:
        """Ask for an update (returns at once)."""
        self.asked.set()

    def _run(self) -> None:
        while True:
            self.asked.wait()
            if self.closing:
                return
            self.asked.clear()
            began = time.monotonic()
            self._update()
            if self.ending.wait(max(0.0, self.min_interval_s - (time.monotonic() - began))):  # close() cut it short
                return

    def _update(self) -> None:
        try:
            self.update()
        except Exception as e:  # noqa: BLE001 - a view that cannot be drawn never stops training; said once
            if not self.failed:
                print(f"[hpcdl] could not update the run's plot or TensorBoard events: {type(e).__name__}: {e}",
                      file=sys.stderr, flush=True)
            self.failed = True

    def close(self) -> None:
        """Stop the thread (after the update it is running) and update once more here: the final views."""
        self.closing = True
        self.asked.set()
        self.ending.set()
        self.thread.join()
        self._update()
