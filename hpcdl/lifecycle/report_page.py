"""The experiment page of a job or a sweep, gathered from the store (python -m hpcdl.jobs report ID|SWEEP), and
the TensorBoard command that shows their event files (python -m hpcdl.jobs tensorboard ID|SWEEP)."""

from __future__ import annotations

import getpass
import json
import socket
import time
from pathlib import Path
from typing import Any, Optional

from hpcdl.lifecycle.job import Job
from hpcdl.lifecycle.states import resolve_sweep
from hpcdl.lifecycle.sweep_report import USER_METRIC, summary, user_metric_keys
from hpcdl.store.atomic import atomic_write_text
from hpcdl.store.files import CONFUSION, MULTIRUN, REPORT_FIELDS, RESULT
from hpcdl.store.folders import DAMAGED, JobRecord, load_record
from hpcdl.store.metrics import read_records
from hpcdl.store.safety import read_job_file
from hpcdl.store.states import CANCELLED, COMPLETED
from hpcdl.store.sweeps import is_sweep
from hpcdl.view import page, tensorboard
from hpcdl.view.progress_plot import RunFacts, png_bytes, user_metrics

LOG_TAIL_LINES = 40
"""Lines of each rank's stdout shown on a job's page."""
METRICS = ("best_validation_accuracy", "validation_accuracy", "value", "accuracy", "loss")
"""What a sweep's best trial is chosen by when no metric is named: the first that some trial has."""


def _json_file(folder: Path, name: str) -> Optional[dict[str, Any]]:
    """A small JSON object of a job folder, or None when it is missing or not an object."""
    try:
        data = read_job_file(folder, name)
        value = json.loads(data) if data is not None else None
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _split(records: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    return ([r for r in records if r.get("kind") == "iteration" and isinstance(r.get("iteration"), (int, float))],
            [r for r in records if r.get("kind") == "validation" and isinstance(r.get("iteration"), (int, float))])


def _when(seconds: Any) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds)) if isinstance(seconds, (int, float)) else "-"


def sweep_html(sweep: JobRecord, points: list[JobRecord], metric: Optional[str] = None) -> str:
    """The page of ``sweep`` whose ``points`` have been resolved."""
    rows = summary(points)
    own = user_metric_keys(rows)
    if metric is not None and metric not in METRICS and USER_METRIC + metric in own:
        metric = USER_METRIC + metric  # a metric the points' own code reported by that name
    metric = metric or next((m for m in (*METRICS, *own) if any(r.get(m) is not None for r in rows)), METRICS[0])
    curves, confusions = {}, {}
    for point in points:
        if point.state == DAMAGED:
            continue
        curves[point.id] = _split(read_records(point))
        confusion = _json_file(point.folder, CONFUSION)
        if confusion is not None:
            confusions[point.id] = confusion
    m = sweep.manifest
    definition = (read_job_file(sweep.folder, MULTIRUN) or b"").decode(errors="replace")
    command = " ".join(str(o) for o in m.get("overrides") or [])
    facts = [("sweep", sweep.id), ("state", f"{sweep.state} ({sweep.reason})"), ("profile", str(m.get("profile"))),
             ("submitted", f"{_when(m.get('submitted_at'))} from {(m.get('submitted_from') or {}).get('host', '-')}"),
             ("command", command or "-"), ("page written", _when(time.time()))]
    return page.sweep_page(f"Sweep {sweep.id} ({m.get('name')})", facts,
                           f"python -m hpcdl.submit {command}\n\n{definition}", rows, curves, confusions, metric,
                           [(key, key.removeprefix(USER_METRIC)) for key in own])


def job_html(job: Job) -> str:
    """The page of one job: its progress plot, facts, each rank's log tail and the first error."""
    from hpcdl.lifecycle.follow import progress_words
    from hpcdl.store.metrics import progress

    record = job.refresh()
    m = record.manifest
    iterations, validations = _split(read_records(record))
    result = _json_file(record.folder, RESULT) or {}
    training = m.get("kind") == "train"
    max_epochs = ((record.plan.get("config") or {}).get("training") or {}).get("max_epochs") if training else None
    facts = RunFacts(environment=str(result.get("device") or ""), max_epochs=max_epochs,
                     stop_reason=str(result.get("stop_reason") or (record.state if record.final else "")))
    plot = png_bytes(iterations, validations, facts, () if training else user_metrics(iterations, REPORT_FIELDS))
    ranks = record.plan.get("world_size", 1) if record.state != DAMAGED else 1
    logs = {}
    for rank in range(ranks if isinstance(ranks, int) and ranks > 0 else 1):
        logs[rank] = "\n".join(job.logs(rank).splitlines()[-LOG_TAIL_LINES:])
    error = job.error() if record.final and record.state not in (COMPLETED, CANCELLED) else ""
    status = record.status
    facts_shown = [("job", record.id), ("state", record.state + (f" ({record.reason})" if record.reason else "")),
                   ("progress", progress_words(progress(record)) or "-"), ("kind", str(m.get("kind"))),
                   ("profile", str(m.get("profile"))), ("host", str(status.get("host", "-"))),
                   ("submitted", _when(m.get("submitted_at"))),
                   ("overrides", " ".join(m.get("overrides") or []) or "-"),
                   ("device", str(result.get("device") or "-")), ("folder", str(record.folder)),
                   ("page written", _when(time.time()))]
    return page.job_page(f"Job {record.id} ({m.get('name')})", facts_shown, plot, logs, error,
                         _json_file(record.folder, CONFUSION))


def write_report(key: str, to: Optional[Path] = None, metric: Optional[str] = None) -> Path:
    """Write the page of the job or sweep ``key`` to ``to`` (default: report.html in its folder); its path."""
    from hpcdl.store.files import REPORT_PAGE

    job = Job.attach(key)
    if is_sweep(job.refresh()):
        sweep = load_record(job.folder)
        points = [] if sweep is None or sweep.state == DAMAGED else resolve_sweep(sweep, {})
        text = sweep_html(sweep, points, metric)
    else:
        text = job_html(job)
    target = to or job.folder / REPORT_PAGE
    atomic_write_text(target, text)
    return target


def tensorboard_command(key: str, port: int = 6006) -> str:
    """The tensorboard command for a job's event files, or a sweep's points' (each named by its number and the
    overrides that vary), and the ssh line that forwards its port from a login node."""
    from hpcdl.lifecycle.sweep_report import varying_overrides

    job = Job.attach(key)
    record = job.refresh()
    if is_sweep(record):
        points = resolve_sweep(record, {})
        labels = varying_overrides([[str(o) for o in p.manifest.get("sweep", {}).get("overrides", [])]
                                    for p in points])
        runs = {f"{n}_{label.replace(' ', '_').replace(',', ';')}" if label else str(n):
                tensorboard.events_folder(p.folder) for n, (p, label) in enumerate(zip(points, labels))}
    else:
        runs = {record.id: tensorboard.events_folder(record.folder)}
    return tensorboard.logdir_command(runs, socket.getfqdn(), getpass.getuser(), port)
