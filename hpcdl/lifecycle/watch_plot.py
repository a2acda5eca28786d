"""jobs watch ID --plot: the job's progress plot kept up to date in a PNG of the user's choosing, and its curves
as text lines under the progress line (a terminal over ssh shows them; an image viewer reloads the PNG)."""

from __future__ import annotations

import time
from pathlib import Path

from hpcdl.store.files import REPORT_FIELDS
from hpcdl.store.folders import JobRecord
from hpcdl.store.metrics import read_records
from hpcdl.view.progress_plot import RunFacts, smoothed, smoothing_weight, user_metrics, write_progress_plot
from hpcdl.view.terminal import curve_line

REDRAW_INTERVAL_S = 5.0
"""The PNG is drawn again at most this often while records come in (and once more when the job ends)."""


class WatchPlot:
    """Called at each look at the job: redraws ``path`` when new records came (at most every REDRAW_INTERVAL_S,
    and when the job has ended) and returns the lines to show under the progress line."""

    def __init__(self, path: Path, width: int = 60) -> None:
        self.path, self.width = path, width
        self.seen, self.drawn_at, self.lines = -1, 0.0, [f"plot      {path} (once the job reports progress)"]

    def __call__(self, record: JobRecord) -> list[str]:
        if not record.final and time.monotonic() - self.drawn_at < REDRAW_INTERVAL_S:
            return self.lines
        records = read_records(record)
        if len(records) == self.seen:
            return self.lines
        self.seen, self.drawn_at = len(records), time.monotonic()
        iterations = [r for r in records if r.get("kind") == "iteration"]
        validations = [r for r in records if r.get("kind") == "validation"]
        training = record.manifest.get("kind") == "train"
        config = (record.plan.get("config") or {}).get("training") or {}
        metrics = () if training else user_metrics(iterations, REPORT_FIELDS)
        facts = RunFacts(max_epochs=config.get("max_epochs") if training else None,
                         stop_reason=record.state if record.final else "")
        if not write_progress_plot(self.path, iterations, validations, facts, metrics):
            return self.lines
        lines = []
        for label, key, records_of, percent in (("training loss", "loss", iterations, False),
                                                ("train accuracy", "accuracy", iterations, True),
                                                ("val. accuracy", "accuracy", validations, True),
                                                *((name, name, iterations, False) for name in metrics)):
            values = [float(r[key]) for r in records_of if isinstance(r.get(key), (int, float))]
            if records_of is iterations:  # the trend, as the plot's smoothed curve
                values = smoothed(values, smoothing_weight(len(values)))
            lines.append(curve_line(label, values, self.width, percent))
        self.lines = [line for line in lines if line] + [f"plot      {self.path}"]
        return self.lines
