"""Following a job: its progress from the metrics file, a live progress line, the end result."""

from __future__ import annotations

import json
import sys
import time
from typing import Any, Optional, TextIO

from hpcdl.store.job import Job
from hpcdl.store.files import METRICS
from hpcdl.store.folders import JobRecord
from hpcdl.store.metrics import MetricsSummary, read_summary
from hpcdl.store.safety import open_job_file


def read_records(record: JobRecord) -> list[dict[str, Any]]:
    """Every metrics record of a job (for plots: listings read its summary, hpcdl.store.metrics)."""
    try:
        with open_job_file(record.folder, METRICS) as f:
            lines = f.read().decode(errors="replace").splitlines()
    except FileNotFoundError:
        return []
    records = []
    for line in lines:
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:  # a line still being written
            continue
    return records


def progress(record: JobRecord) -> dict[str, Any]:
    """Fraction done, last epoch/iteration/loss/accuracy and best validation accuracy of a training job
    (from the run's metrics summary; a listing's record carries it from the store's index)."""
    view = dict(record.progress) if record.progress is not None else _view(record, read_summary(record.folder))
    if record.state == "COMPLETED":
        view["fraction"] = 1.0
    return view


def _view(record: JobRecord, summary: MetricsSummary) -> dict[str, Any]:
    config = record.plan.get("config") or {}
    max_epochs = (config.get("training") or {}).get("max_epochs")
    view: dict[str, Any] = {"max_epochs": max_epochs}
    last = summary.last
    if last is not None:
        view.update(epoch=last["epoch"], iteration=last["iteration"], loss=last["loss"], accuracy=last["accuracy"])
        if last.get("total"):  # hpcdl.report(..., total=N) from the user's code
            view["fraction"] = min(1.0, last["iteration"] / last["total"])
        elif max_epochs:
            if summary.per_epoch:
                view["fraction"] = min(1.0, last["iteration"] / (summary.per_epoch * max_epochs))
            else:
                view["fraction"] = (last["epoch"] - 1) / max_epochs
    if summary.best_validation_accuracy is not None:
        view["best_validation_accuracy"] = summary.best_validation_accuracy
        view["validation_accuracy"] = summary.validation_accuracy
    return view


def progress_line(record: JobRecord, view: dict[str, Any], width: int = 24) -> str:
    """One line: a bar, epoch and iteration, loss and accuracies, state."""
    fraction = view.get("fraction")
    bar = "" if fraction is None else "[" + "#" * round(fraction * width) + "." * (width - round(fraction * width)) + "] "
    parts = [f"{record.id} {record.state:<9s}", bar.rstrip()]
    if "iteration" in view:
        epochs = f"epoch {view['epoch']}/{view['max_epochs']} " if view.get("max_epochs") else ""
        parts.append(f"{epochs}iter {view['iteration']} loss {view['loss']:.4f}")
        if view.get("accuracy") is not None:
            parts.append(f"acc {100 * view['accuracy']:.1f}%")
    if view.get("validation_accuracy") is not None:
        parts.append(f"val {100 * view['validation_accuracy']:.1f}%")
    return " ".join(p for p in parts if p)


def follow(job: Job, out: TextIO = sys.stdout, poll_s: float = 1.0) -> str:
    """Show the job's progress until it ends; returns its final state."""
    live = out.isatty()
    last_line = ""
    while True:
        record = job.refresh()
        line = progress_line(record, progress(record))
        if line != last_line:
            print(("\r\033[K" + line) if live else line, end="" if live else "\n", file=out, flush=True)
            last_line = line
        if record.final:
            if live:
                print(file=out)
            return record.state
        time.sleep(poll_s)


def format_summary(summary: dict[str, Any]) -> str:
    """A training job's result.json as aligned 'key: value' lines (the config left out)."""
    lines = []
    for key, value in summary.items():
        if key in ("config", "network"):
            continue
        if isinstance(value, float):
            value = f"{value:.4f}"
        elif isinstance(value, list):
            value = ", ".join(map(str, value))
        lines.append(f"{key + ':':21s}{value}")
    return "\n".join(lines)
