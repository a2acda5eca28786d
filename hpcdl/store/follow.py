"""Following a job: its progress from the metrics file, a live progress line, the end result."""

from __future__ import annotations

import json
import sys
import time
from typing import Any, Optional, TextIO

from hpcdl.store.job import Job
from hpcdl.store.files import METRICS, REPORT_FIELDS
from hpcdl.store.folders import JobRecord
from hpcdl.store.safety import open_job_file
from hpcdl.store.sweeps import is_sweep, points_done

TAIL_BYTES = 65536


def read_records(record: JobRecord, tail_bytes: Optional[int] = TAIL_BYTES) -> list[dict[str, Any]]:
    """The metrics records of a job (only those in the last ``tail_bytes`` when given)."""
    try:
        with open_job_file(record.folder, METRICS) as f:
            if tail_bytes is not None:
                f.seek(0, 2)
                f.seek(max(0, f.tell() - tail_bytes))
            lines = f.read().decode(errors="replace").splitlines()
    except FileNotFoundError:
        return []
    records = []
    for line in lines[1:] if tail_bytes is not None and len(lines) > 1 else lines:
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut by the tail or still being written
            continue
    return records


def progress(record: JobRecord, records: Optional[list[dict[str, Any]]] = None) -> dict[str, Any]:
    """Fraction done, last epoch/iteration/loss/accuracy and best validation accuracy of a job: a training job's
    epochs of training.max_epochs, or what the user's code reported (step of total, its own metrics)."""
    records = read_records(record) if records is None else records
    iterations = [r for r in records if r["kind"] == "iteration"]
    validations = [r for r in records if r["kind"] == "validation" and r.get("accuracy") is not None]
    trainer = record.manifest.get("kind") not in ("entry", "script", "function")
    config = record.plan.get("config") or {}
    max_epochs = (config.get("training") or {}).get("max_epochs") if trainer else None
    view: dict[str, Any] = {"max_epochs": max_epochs}
    if iterations:
        last = iterations[-1]
        view.update(epoch=last.get("epoch"), iteration=last["iteration"], loss=last.get("loss"),
                    accuracy=last.get("accuracy"), total=last.get("total"))
        if not trainer:
            view["metrics"] = {k: v for k, v in last.items() if k not in REPORT_FIELDS}
        if last.get("total"):  # the trainer's iterations in all, or hpcdl.report(..., total=N) from the user's code
            view["fraction"] = min(1.0, last["iteration"] / last["total"])
        elif max_epochs:
            # the first iteration of an epoch after the first counts the iterations of those before it
            per_epoch = next(((r["iteration"] - 1) / (r["epoch"] - 1) for before, r in zip(iterations, iterations[1:])
                              if r["epoch"] > before["epoch"] and r["iteration"] > 1), None)
            if per_epoch:
                view["total"] = round(per_epoch * max_epochs)
                view["fraction"] = min(1.0, last["iteration"] / (per_epoch * max_epochs))
            else:
                view["fraction"] = (last["epoch"] - 1) / max_epochs
    if validations:
        view["best_validation_accuracy"] = max(r["accuracy"] for r in validations)
        view["validation_accuracy"] = validations[-1]["accuracy"]
    if record.state == "COMPLETED":
        view["fraction"] = 1.0
    return view


def progress_words(view: dict[str, Any]) -> str:
    """Where a run is, in words: 'epoch 3 of 8, iteration 120 of 184 (65%); loss 0.4120, accuracy 87.5%, ...'."""
    if "iteration" not in view:
        return ""
    epoch = f"epoch {view['epoch']} of {view['max_epochs']}, " if view.get("max_epochs") else ""
    total = f" of {view['total']}" if view.get("total") else ""
    done = f" ({100 * view['fraction']:.0f}%)" if view.get("fraction") is not None else ""
    metrics = [] if view.get("loss") is None else [f"loss {view['loss']:.4f}"]
    for name, key in (("accuracy", "accuracy"), ("validation accuracy", "validation_accuracy"),
                      ("best", "best_validation_accuracy")):
        if view.get(key) is not None:
            metrics.append(f"{name} {100 * view[key]:.2f}%")
    return f"{epoch}iteration {view['iteration']}{total}{done}" + (f"; {', '.join(metrics)}" if metrics else "")


def progress_line(record: JobRecord, view: dict[str, Any], width: int = 24) -> str:
    """One line: a bar, epoch and iteration (or the user's step of total), loss, accuracies, metrics, state."""
    fraction = view.get("fraction")
    bar = "" if fraction is None else "[" + "#" * round(fraction * width) + "." * (width - round(fraction * width)) + "] "
    parts = [f"{record.id} {record.state:<9s}", bar.rstrip()]
    if "iteration" in view:
        if view.get("max_epochs"):
            parts.append(f"epoch {view['epoch']}/{view['max_epochs']} iter {view['iteration']}")
        else:
            epoch = f"epoch {view['epoch']} " if view.get("epoch") is not None else ""
            parts.append(f"{epoch}step {view['iteration']}" + (f"/{view['total']}" if view.get("total") else ""))
        if view.get("loss") is not None:
            parts.append(f"loss {view['loss']:.4f}")
        if view.get("accuracy") is not None:
            parts.append(f"acc {100 * view['accuracy']:.1f}%")
        parts += [f"{name} {value:.4g}" for name, value in view.get("metrics", {}).items()
                  if isinstance(value, (int, float))]
    if view.get("validation_accuracy") is not None:
        parts.append(f"val {100 * view['validation_accuracy']:.1f}%")
    return " ".join(p for p in parts if p)


def follow(job: Job, out: TextIO = sys.stdout, poll_s: float = 1.0, timeout: Optional[float] = None) -> str:
    """Show the job's progress (a sweep's: k of N points done) until it ends; returns its final state.
    TimeoutError once ``timeout`` seconds have passed."""
    live = out.isatty()
    last_line = ""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        record = job.refresh()
        line = f"{record.id} {record.state:<9s} {points_done(record)}" if is_sweep(record) \
            else progress_line(record, progress(record))
        if line != last_line:
            print(("\r\033[K" + line) if live else line, end="" if live else "\n", file=out, flush=True)
            last_line = line
        if record.final:
            if live:
                print(file=out)
            return record.state
        if deadline is not None and time.monotonic() > deadline:
            if live:
                print(file=out)
            raise TimeoutError(f"job {record.id} still {record.state} after {timeout} s")
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


def format_result(kind: str, result: Any) -> str:
    """A job's result for the screen: a training job's summary, or the value the user's code returned or saved
    (None when it saved none)."""
    return format_summary(result) if kind == "train" else f"result: {result!r}"
