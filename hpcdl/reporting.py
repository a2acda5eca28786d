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
import time
from pathlib import Path
from typing import Any, Optional

from hpcdl.distributed import heartbeat
from hpcdl.store.files import FUNCTION_RESULT
from hpcdl.store.metrics import MetricsLog

_started = time.monotonic()
_log: Optional[MetricsLog] = None


def _job_folder() -> Optional[Path]:
    """The job folder when this process is rank 0 of a job, else None."""
    folder = os.environ.get("HPCDL_JOB_FOLDER")
    return Path(folder) if folder and os.environ.get("RANK", "0") == "0" else None


def _append(record: dict[str, Any]) -> None:
    global _log
    folder = _job_folder()
    if folder is None:
        return
    if _log is None:
        _log = MetricsLog(folder)
    _log.write({**record, "time_s": round(time.monotonic() - _started, 4)})


def close_metrics() -> None:
    """Save the summary of the records reported (the job calls this when the user's code returns)."""
    global _log
    if _log is not None:
        _log.close()
        _log = None


def report(step: int, loss: Optional[float] = None, *, accuracy: Optional[float] = None,
           epoch: Optional[int] = None, total: Optional[int] = None, **metrics: float) -> None:
    """Record step ``step`` (from 1) of ``total`` (`jobs list`'s percentage, `jobs watch`'s step k/N): its loss,
    accuracy in [0, 1], epoch and any other numbers, each only when given (the plot draws a panel for each)."""
    heartbeat.stepped()
    _append({"kind": "iteration", "epoch": epoch, "iteration": int(step),
             "loss": None if loss is None else float(loss), "accuracy": None if accuracy is None else float(accuracy),
             "total": total, **{k: float(v) for k, v in metrics.items()}})


def report_validation(step: int, loss: float, *, accuracy: Optional[float] = None,
                      epoch: Optional[int] = None) -> None:
    """Record a validation after step ``step`` (dashed points in the plot)."""
    _append({"kind": "validation", "epoch": epoch, "iteration": int(step), "loss": float(loss),
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
