"""The names of the files in a job folder, defined once for the submit side, the ranks and the readers."""

from __future__ import annotations

import re
from pathlib import Path

MANIFEST = "manifest.json"
"""What was submitted: the job plan, overrides, time, host, git commit; written atomically at submission."""
STATUS = "status.json"
"""The running job's own view of its state, written by its lead rank."""
FINAL = "final.json"
"""The job's final state: created once, by whichever rank, launcher, cancel or listing ended it first."""
MODEL = "model.pt"
"""The trained network's state dict (loads with torch.load(weights_only=True))."""
INFO = "info.json"
"""Every iteration's and validation's record (TrainingInfo)."""
RESULT = "result.json"
"""The training summary."""
METRICS = "metrics.jsonl"
"""One JSON line per iteration and validation, appended as training goes."""
REPORT_FIELDS = ("kind", "epoch", "iteration", "loss", "accuracy", "total", "time_s")
"""The fields of an hpcdl.report record in METRICS; any other is a number of the user's own."""
METRICS_SUMMARY = "metrics-summary.json"
"""What listings show of metrics.jsonl (counts, last iteration, best validation), kept by the run as it writes."""
PLOT = "training-progress.png"
"""The training-progress plot."""
CHECKPOINTS = "checkpoints"
"""The folder of checkpoints."""
CHECKPOINT_NAME = re.compile(r"^checkpoint-(\d{9})\.pt$")
"""A checkpoint's file in CHECKPOINTS: the iteration it was taken after, in 9 digits."""
RANKS_DONE = "ranks-done"
"""One empty file per rank that returned; the rank that completes the set writes COMPLETED."""
LOGS = "logs"
"""The folder of a local job's stdout.log and stderr.log (and each rank's, rankN.stdout.log)."""
HEARTBEATS = "heartbeats"
"""Each rank's rankN.json, rewritten every few seconds while it lives (hpcdl.distributed.heartbeat)."""
FUNCTION = "function.pkl"
"""hpcdl.batch: the pickled (fn, args, kwargs)."""
CODE = "code"
"""The snapshot of the submitting folder's code that the ranks run from."""
RESULTS_DIR = "results"
"""User code's results folder (HPCDL_RESULTS_DIR on every rank), fetched with the job."""
FUNCTION_RESULT = "result.pkl"
"""hpcdl.batch: the pickled return value."""
RANK_RESULTS = "rank-results"
"""hpcdl.batch(all_ranks=True): each rank's pickled return value, as N.pkl."""
SUMMARY_CSV = "sweep-summary.csv"
"""In a sweep's folder: one row per point (jobs sweep --csv)."""
SUMMARY_PLOT = "sweep-curves.png"
"""In a sweep's folder: the points' curves in one plot (jobs sweep --plot)."""
RESULTS = (MODEL, INFO, RESULT, METRICS, PLOT)
"""What jobs fetch copies of a training job."""


def checkpoint_file(folder: Path, iteration: int) -> Path:
    """The file of the checkpoint taken after ``iteration`` in ``folder``."""
    return folder / f"checkpoint-{iteration:09d}.pt"


def checkpoint_files(folder: Path) -> list[tuple[int, Path]]:
    """(iteration, file) of every checkpoint in ``folder``, oldest first; none when there is no such folder."""
    found = []
    for path in folder.iterdir() if folder.is_dir() else ():
        match = CHECKPOINT_NAME.match(path.name)
        if match:
            found.append((int(match.group(1)), path))
    return sorted(found)
