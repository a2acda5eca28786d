"""A run's metrics: metrics.jsonl, one JSON line per iteration and validation, and its summary beside it.

The summary (counts, the last iteration, the best and last validation accuracy, how many bytes of
metrics.jsonl it covers) is kept by the run as it appends, rewritten atomically at most every
SUMMARY_INTERVAL_S and when the run closes its log. A reader takes the summary and folds in the lines
written after it (a few seconds' worth), so no listing re-reads a whole metrics file, nor trusts a tail.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Iterable, Optional

from hpcdl.errors import FolderGoneError
from hpcdl.store.atomic import atomic_open, atomic_write_text
from hpcdl.store.files import METRICS, METRICS_SUMMARY, REPORT_FIELDS
from hpcdl.store.folders import JobRecord
from hpcdl.store.safety import open_job_file, read_job_file
from hpcdl.store.states import COMPLETED

SUMMARY_INTERVAL_S = 5.0
"""How often a run rewrites its summary while it appends records (and once more when it closes)."""
_LAST_KEYS = ("epoch", "iteration", "loss", "accuracy", "total", "metrics")


@dataclass
class MetricsSummary:
    """What listings need of a run's records, folded one record at a time."""

    bytes: int = 0
    """How much of metrics.jsonl the summary covers."""
    iterations: int = 0
    validations: int = 0
    last: Optional[dict[str, Any]] = None
    """The last iteration's epoch, iteration, loss, accuracy, total (hpcdl.report's ``total``) and metrics (the
    other numbers the user's code reported)."""
    per_epoch: Optional[float] = None
    """Iterations per epoch: counted by the first iteration of an epoch after the first."""
    best_validation_accuracy: Optional[float] = None
    validation_accuracy: Optional[float] = None

    def add(self, record: dict[str, Any]) -> None:
        """Fold in one record (KeyError or TypeError for an iteration record without its numbers: an iteration,
        and an epoch and loss where given)."""
        if record.get("kind") == "iteration":
            before, self.iterations = self.last, self.iterations + 1
            for key in ("epoch", "iteration", "loss"):
                if not isinstance(record[key], (int, float)) and (key == "iteration" or record[key] is not None):
                    raise TypeError(f"{METRICS}: an iteration's {key!r} is {record[key]!r}")
            self.last = {key: record.get(key) for key in _LAST_KEYS if key != "metrics"}
            self.last["metrics"] = {key: value for key, value in record.items()
                                    if key not in REPORT_FIELDS and isinstance(value, (int, float))}
            if self.per_epoch is None and before is not None and record["epoch"] is not None \
                    and before["epoch"] is not None and record["epoch"] > before["epoch"] and record["epoch"] > 1 \
                    and record["iteration"] > 1:  # epochs counted from 1 (the user's code may count from 0)
                self.per_epoch = (record["iteration"] - 1) / (record["epoch"] - 1)
        elif record.get("kind") == "validation":
            self.validations += 1
            accuracy = record.get("accuracy")
            if isinstance(accuracy, (int, float)):
                self.validation_accuracy = accuracy
                self.best_validation_accuracy = max(accuracy, self.best_validation_accuracy or accuracy)

    def add_lines(self, data: bytes) -> None:
        """Fold in the complete lines of ``data`` (read from ``self.bytes`` on); a line still being written
        is left for later, a line that is not a JSON object is skipped."""
        end = data.rfind(b"\n") + 1
        for line in data[:end].splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                self.add(record)
        self.bytes += end

    @classmethod
    def from_json(cls, value: Any) -> "MetricsSummary":
        """A summary from its file's content; ValueError for anything not of its shape."""
        if not isinstance(value, dict) or set(value) != {f.name for f in fields(cls)}:
            raise ValueError(f"{METRICS_SUMMARY}: not a metrics summary")
        summary = cls(**value)
        numbers = (summary.bytes, summary.iterations, summary.validations)
        if not all(isinstance(n, int) and n >= 0 for n in numbers) or not (
                summary.last is None or isinstance(summary.last, dict) and set(summary.last) == set(_LAST_KEYS)):
            raise ValueError(f"{METRICS_SUMMARY}: not a metrics summary")
        return summary


def read_summary(folder: Path) -> MetricsSummary:
    """The summary of the run in ``folder`` as of now: its summary file and the records appended since.

    Without a summary file (a job of an earlier version), or when metrics.jsonl was rewritten since, the
    whole file is folded. ValueError for a summary file of the wrong shape.
    """
    saved = read_job_file(folder, METRICS_SUMMARY)
    summary = MetricsSummary() if saved is None else MetricsSummary.from_json(json.loads(saved))
    try:
        with open_job_file(folder, METRICS) as f:
            size = os.fstat(f.fileno()).st_size
            if size < summary.bytes:  # rewritten (a resumed run) after this summary was saved
                summary = MetricsSummary()
            f.seek(summary.bytes)
            summary.add_lines(f.read())
    except FileNotFoundError:
        pass
    return summary


class MetricsLog:
    """metrics.jsonl of a run that appends to it, its summary saved at most every SUMMARY_INTERVAL_S."""

    def __init__(self, folder: Path, records: Optional[Iterable[dict[str, Any]]] = None) -> None:
        """Start from ``records`` (the file rewritten with them: a resumed trainer keeps only its past), or
        else from what the file holds (hpcdl.report's records of an earlier run go on)."""
        self.path, self.summary_path = folder / METRICS, folder / METRICS_SUMMARY
        self.summary = MetricsSummary()
        if records is not None:
            with atomic_open(self.path) as f:
                for record in records:
                    f.write(json.dumps(record) + "\n")
        self.file = open(self.path, "ab")
        if self.file.tell():
            with open(self.path, "rb") as existing:
                self.summary.add_lines(existing.read(self.file.tell()))
        self.saved_at = 0.0
        self.save()

    def write(self, record: dict[str, Any]) -> None:
        """Append one record; the summary is saved when it is due."""
        if os.fstat(self.file.fileno()).st_nlink == 0:  # deleted with its folder: written to no one
            raise FolderGoneError(f"{self.path}: deleted while the job ran; stopping")
        line = (json.dumps(record) + "\n").encode()
        self.file.write(line)
        self.file.flush()
        self.summary.add(record)
        self.summary.bytes += len(line)
        if time.monotonic() - self.saved_at > SUMMARY_INTERVAL_S:
            self.save()

    def save(self) -> None:
        """Rewrite the summary (atomically) to cover every record written so far."""
        atomic_write_text(self.summary_path, json.dumps(asdict(self.summary)) + "\n")
        self.saved_at = time.monotonic()

    def close(self) -> None:
        """Save the summary and close the file."""
        self.save()
        self.file.close()


def read_records(record: JobRecord) -> list[dict[str, Any]]:
    """Every metrics record of a job (for plots: listings read its summary)."""
    return read_metrics(record.folder)


def read_metrics(folder: Path) -> list[dict[str, Any]]:
    """Every metrics record in the job folder ``folder``, read safely; a line still being written (or one an
    earlier run was cut in) and lines that are no JSON object are left out."""
    try:
        with open_job_file(folder, METRICS) as f:
            lines = f.read().decode(errors="replace").splitlines()
    except FileNotFoundError:
        return []
    records = []
    for line in lines:
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return [r for r in records if isinstance(r, dict)]


def progress(record: JobRecord) -> dict[str, Any]:
    """Fraction done, last epoch/iteration/loss/accuracy and best validation accuracy of a job: a training job's
    epochs of training.max_epochs, or what the user's code reported (step of total, its own metrics); from the
    run's metrics summary (a listing's record carries it from the store's index)."""
    view = dict(record.progress) if record.progress is not None else _view(record, read_summary(record.folder))
    if record.state == COMPLETED:
        view["fraction"] = 1.0
    return view


def _view(record: JobRecord, summary: MetricsSummary) -> dict[str, Any]:
    trainer = record.manifest.get("kind") not in ("entry", "script", "function")
    config = record.plan.get("config") or {}
    max_epochs = (config.get("training") or {}).get("max_epochs") if trainer else None
    view: dict[str, Any] = {"max_epochs": max_epochs}
    last = summary.last
    if last is not None:
        view.update(epoch=last["epoch"], iteration=last["iteration"], loss=last["loss"], accuracy=last["accuracy"],
                    total=last["total"])
        if not trainer:
            view["metrics"] = last["metrics"]
        if last.get("total"):  # the trainer's iterations in all, or hpcdl.report(..., total=N) from the user's code
            view["fraction"] = min(1.0, last["iteration"] / last["total"])
        elif max_epochs:
            if summary.per_epoch:
                view["total"] = round(summary.per_epoch * max_epochs)
                view["fraction"] = min(1.0, last["iteration"] / (summary.per_epoch * max_epochs))
            else:
                view["fraction"] = (last["epoch"] - 1) / max_epochs
    if summary.best_validation_accuracy is not None:
        view["best_validation_accuracy"] = summary.best_validation_accuracy
        view["validation_accuracy"] = summary.validation_accuracy
    return view
