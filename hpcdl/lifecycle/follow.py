"""Following a job: its progress in words, a live progress line, the end result (the progress itself: store.metrics)."""

from __future__ import annotations

import sys
import time
from typing import Any, Callable, Optional, TextIO

from hpcdl.lifecycle.job import Job
from hpcdl.lifecycle.pace_report import straggler_flags
from hpcdl.store.folders import JobRecord
from hpcdl.store.metrics import progress
from hpcdl.store.sweeps import is_sweep, points_done


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


def follow(job: Job, out: TextIO = sys.stdout, poll_s: float = 1.0, timeout: Optional[float] = None,
           extra: Optional[Callable[[JobRecord], list[str]]] = None) -> str:
    """Show the job's progress (a sweep's: k of N points done) until it ends; returns its final state.
    ``extra`` gives lines to show under the progress line at each look. TimeoutError once ``timeout`` seconds
    have passed."""
    live = out.isatty()
    last: list[str] = []
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        record = job.refresh()
        line = f"{record.id} {record.state:<9s} {points_done(record)}" if is_sweep(record) \
            else " | ".join(filter(None, (progress_line(record, progress(record)), straggler_flags(record))))
        block = [line, *(extra(record) if extra else [])]
        if block != last:
            if live:  # back to the block's first line, each line drawn over
                up = f"\033[{len(last) - 1}F" if len(last) > 1 else ""
                print(up + "\r" + "\n".join("\033[K" + text for text in block), end="", file=out, flush=True)
            else:
                print("\n".join(block), file=out, flush=True)
            last = block
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
