"""Progress and results from your own code (entry=, script=, hpcdl.batch): the same records, plot and
listing as the built-in trainer's.

    import hpcdl
    for step in range(steps):
        ...
        hpcdl.report(step=step + 1, total=steps, loss=loss.item(), accuracy=acc)  # jobs watch, list, plot
    hpcdl.save_result({"best": best})                                 # job.result(), jobs fetch
    torch.save(model.state_dict(), hpcdl.results_dir() / "model.pt") # fetched with the job

Rank 0 alone writes (the others' calls do nothing); outside a job they do nothing either.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Any, Optional

from hpcdl.distributed import heartbeat
from hpcdl.store.files import FUNCTION_RESULT, METRICS, PLOT, REPORT_FIELDS
from hpcdl.store.metrics import MetricsLog, read_metrics
from hpcdl.view import tensorboard
from hpcdl.view.live import LiveViews
from hpcdl.view.progress_plot import RunFacts, user_metrics, write_progress_plot

_started = time.monotonic()
_log: Optional[MetricsLog] = None
_records: list[dict[str, Any]] = []
_views: Optional[LiveViews] = None
_events: Optional[tensorboard.EventLog] = None
_facts = RunFacts()


def _job_folder() -> Optional[Path]:
    """The job folder when this process is rank 0 of a job, else None."""
    folder = os.environ.get("HPCDL_JOB_FOLDER")
    return Path(folder) if folder and os.environ.get("RANK", "0") == "0" else None


def _append(record: dict[str, Any]) -> None:
    global _log, _views
    folder = _job_folder()
    if folder is None:
        return
    if _log is None:
        _records[:] = read_metrics(folder)  # an earlier run's reports go on (jobs resume)
        _log = MetricsLog(folder)
        workers = int(os.environ.get("WORLD_SIZE", "1"))
        _facts.environment = f"your code, {workers} rank{'s' if workers > 1 else ''}, rank 0 on {socket.gethostname()}"
        _views = LiveViews(lambda: _update_views(folder))
    record = {**record, "time_s": round(time.monotonic() - _started, 4)}
    _log.write(record)
    _records.append(record)
    _views.request()  # drawn at most every MIN_INTERVAL_S (hpcdl.view.live)


def _update_views(folder: Path) -> None:
    """Redraw training-progress.png (a panel for each kind of value reported) and append TensorBoard events."""
    global _events
    records = list(_records)
    iterations = [r for r in records if r.get("kind") == "iteration"]
    validations = [r for r in records if r.get("kind") == "validation"]
    write_progress_plot(folder / PLOT, iterations, validations, _facts, user_metrics(iterations, REPORT_FIELDS))
    if _events is None and tensorboard.available():
        _events = tensorboard.EventLog(tensorboard.events_folder(folder), time.time() - (time.monotonic() - _started),
                                       fresh=True)
    if _events is not None:
        _events.add(records)


def close_metrics(stop_reason: str = "returned") -> None:
    """Save the summary of the records reported, draw the final plot and events (the job calls this when the
    user's code returns). A script reports from a process of its own: its records are read from the file."""
    global _log, _views, _events
    folder = _job_folder()
    if _log is None and folder is not None and (folder / METRICS).is_file():
        _records[:] = read_metrics(folder)
        _views = LiveViews(lambda: _update_views(folder))
    _facts.stop_reason = stop_reason
    if _views is not None:
        _views.close()
    if _events is not None:
        _events.close()
    if _log is not None:
        _log.close()
    _log, _views, _events = None, None, None


def report(step: int, loss: Optional[float] = None, *, accuracy: Optional[float] = None,
           epoch: Optional[int] = None, total: Optional[int] = None, **metrics: float) -> None:
    """Record step ``step`` (from 1) of ``total`` (`jobs list`'s percentage, `jobs watch`'s step k/N): its loss,
    accuracy in [0, 1], epoch and any other numbers, each only when given (the plot draws a panel for each)."""
    taken = sorted(set(metrics) & set(REPORT_FIELDS))
    if taken:  # they would overwrite the record's own fields
        raise ValueError(f"hpcdl.report: {', '.join(taken)} {'is a name' if len(taken) == 1 else 'are names'} "
                         "of hpcdl's own record; report your metric under another name")
    heartbeat.stepped()
    if total is not None and step >= total:  # what follows (a last validation, saving) makes no step
        heartbeat.steps_ended()
    _append({"kind": "iteration", "epoch": _whole(epoch), "iteration": int(step),
             "loss": None if loss is None else float(loss), "accuracy": None if accuracy is None else float(accuracy),
             "total": _whole(total), **{k: float(v) for k, v in metrics.items()}})


def _whole(value: Any) -> Optional[int]:
    """An epoch or total as JSON holds it: numpy's and torch's integers are plain ints."""
    return None if value is None else int(value)


def report_validation(step: int, loss: float, *, accuracy: Optional[float] = None,
                      epoch: Optional[int] = None) -> None:
    """Record a validation after step ``step`` (dashed points in the plot)."""
    _append({"kind": "validation", "epoch": _whole(epoch), "iteration": int(step), "loss": float(loss),
             "accuracy": None if accuracy is None else float(accuracy)})


def results_dir() -> Path:
    """The job's results folder (fetched with the job); the current folder outside a job."""
    return Path(os.environ.get("HPCDL_RESULTS_DIR", "."))


def save_result(value: Any) -> None:
    """Make ``value`` the job's result (``job.result()``, ``jobs fetch``); pickled with cloudpickle."""
    folder = _job_folder()
    if folder is None:
        return
    import cloudpickle

    from hpcdl.store.atomic import atomic_save

    atomic_save(folder / FUNCTION_RESULT, lambda f: cloudpickle.dump(value, f))
