"""Training progress as MATLAB shows it: a verbose table, a metrics file, a progress plot, callbacks.

Step losses and hit counts are copied to pinned host memory as the step ends,
behind an event; a row, a callback or a validation reads them (waiting for that
step alone), and the rest are read once their event has passed, so the loop
never waits for the GPU because of progress, metrics or plots. The plot and the
TensorBoard events are drawn from the records by a thread of their own
(hpcdl.view.live), asked at the verbose frequency and after each validation.
"""

from __future__ import annotations

import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence, TextIO

import torch

from hpcdl.distributed import pace
from hpcdl.store.atomic import make_folder
from hpcdl.store.files import PLOT
from hpcdl.store.metrics import MetricsLog
from hpcdl.view import tensorboard
from hpcdl.view.live import LiveViews
from hpcdl.view.progress_plot import RunFacts, write_progress_plot
from hpcdl.config import TrainingOptions
from hpcdl.train.settings import RunSettings
from hpcdl.train.datawait import Wait
from hpcdl.train.stopping import ended_by

Record = dict[str, Any]
Callback = Callable[[Record], Optional[bool]]

PENDING_LIMIT = 64

HEADER = ("|  Epoch  |  Iteration  |  Time Elapsed  |  Mini-batch  |  Validation  |  Mini-batch  |"
          "  Validation  |  Base Learning  |\n"
          "|         |             |   (hh:mm:ss)   |   Accuracy   |   Accuracy   |     Loss     |"
          "     Loss     |      Rate       |")


@dataclass
class TrainingInfo:
    """What train_network returns beside the network: every record, and how training ended."""

    history: list[Record] = field(default_factory=list)
    """One record per iteration: epoch, iteration, total (iterations of the whole run), time_s, loss, accuracy,
    learn_rate, samples_per_s, data_wait_s."""
    validation_history: list[Record] = field(default_factory=list)
    """One record per validation: epoch, iteration, time_s, loss, accuracy."""
    stop_reason: str = ""
    """max-epochs, validation-patience, callback, or no-load (a worker with WorkerLoad 0)."""
    device: str = ""
    """The device trained on and why it was chosen."""
    classes: Optional[list[str]] = None
    """Class names of the training data, when it carries them."""
    skipped_files: int = 0
    """Unreadable images skipped (data on_bad_file=skip)."""
    data_wait_s: float = 0.0
    """Seconds the training steps waited for their input (hpcdl.train.datawait), not the steps' own compute."""
    checkpoint_s: float = 0.0
    """Seconds the last checkpoint took to save (to be compared with the signal's lead time)."""
    train_s: float = 0.0
    """Seconds of training (the loop, validation included)."""
    writer: bool = True
    """Whether this process writes the run's files (the lead worker of a distributed run)."""
    speed: dict[str, Any] = field(default_factory=dict)
    """What training.speed chose (precision, channels_last, compile, dispatch, TF32, ...) and why."""

    @property
    def data_wait_share(self) -> float:
        """Share of the training time spent waiting for data."""
        return self.data_wait_s / self.train_s if self.train_s else 0.0

    @property
    def final_validation(self) -> Optional[Record]:
        """The last validation record, if training validated."""
        return self.validation_history[-1] if self.validation_history else None


def _clock(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600:02d}:{s // 60 % 60:02d}:{s % 60:02d}"


def _pct(value: Optional[float]) -> str:
    return "" if value is None else f"{100 * value:.2f}%"


def _num(value: Optional[float]) -> str:
    return "" if value is None else f"{value:.4f}"


@dataclass
class Pending:
    """One step's results until they are read: [loss, hits] on the host once ``done`` has passed."""

    epoch: int
    iteration: int
    time_s: float
    learn_rate: float
    values: torch.Tensor
    has_accuracy: bool
    count: int
    wait: Optional[Wait]
    done: Optional[torch.cuda.Event]


class Progress:
    """Collects step results and turns them into records, table rows, files and callback calls."""

    def __init__(self, options: TrainingOptions, settings: RunSettings, info: TrainingInfo,
                 callbacks: Sequence[Callback], elapsed_before: float = 0.0, out: Optional[TextIO] = None,
                 total: Optional[int] = None, environment: str = "") -> None:
        self.total = total  # iterations of the whole run (max_epochs of them), in each record for `jobs` to show
        self.facts = RunFacts(environment=environment, max_epochs=options.max_epochs)
        self.verbose, self.verbose_frequency, self.plots = settings.verbose, options.verbose_frequency, settings.plots
        self.info, self.callbacks = info, list(callbacks)
        self.out = out or sys.stdout
        self.start = time.perf_counter() - elapsed_before
        self.pending: list[Pending] = []
        self.last_time = self.start
        self.header_printed = False
        self.last_row = 0
        self.folder = settings.output_dir
        if self.folder:
            make_folder(self.folder)
            self.metrics = MetricsLog(self.folder, sorted(  # a resumed run keeps only its past
                info.history + info.validation_history, key=lambda r: (r["iteration"], r["kind"] == "validation")))
        self.events_dir = tensorboard.events_folder(self.folder) if self.folder else settings.rank_events
        self.events: Optional[tensorboard.EventLog] = None
        self.views = LiveViews(self.update_views) if self.events_dir else None

    def elapsed(self) -> float:
        """Seconds of training, counting those before a resume."""
        return time.perf_counter() - self.start

    def step(self, epoch: int, iteration: int, learn_rate: float, loss: torch.Tensor,
             correct: Optional[torch.Tensor], count: int, wait: Optional[Wait] = None) -> None:
        """Queue one finished iteration (1-based ``iteration``); its values are copied to the host behind an event."""
        values = torch.stack([loss.detach().float(), (correct if correct is not None else loss.new_zeros(())).float()])
        done = None
        if values.is_cuda:
            host = torch.empty(2, pin_memory=True)
            host.copy_(values, non_blocking=True)
            values, done = host, torch.cuda.Event()
            done.record()
        self.pending.append(Pending(epoch, iteration, self.elapsed(), learn_rate, values, correct is not None,
                                    count, wait, done))

    def end_iteration(self, validation: Optional[Record]) -> bool:
        """Emit what is due after an iteration; True when a callback asked to stop."""
        iteration = self.pending[-1].iteration
        due = iteration == 1 or iteration % self.verbose_frequency == 0
        row_due = self.verbose and due
        if self.callbacks or row_due or validation:
            self.flush()
        elif len(self.pending) >= PENDING_LIMIT or due and self.views:
            self.flush(wait=False)
        if validation:
            self.add_validation(validation)
        record = self.info.history[-1] if self.info.history and self.info.history[-1]["iteration"] == iteration else None
        if record and (row_due or validation) and self.verbose:
            self.print_row(record, validation)
        stop = False
        for callback in self.callbacks:
            stop = bool(callback({**record, "validation": validation})) or stop
        if self.views and (due or validation):
            self.views.request()
        return stop

    def flush(self, wait: bool = True) -> None:
        """Turn queued step results into records: all of them (waiting for the last step), or with
        ``wait=False`` those whose step has finished on the device."""
        ready = len(self.pending)
        if not wait:
            ready = next((n for n, p in enumerate(self.pending) if p.done is not None and not p.done.query()), ready)
        elif self.pending and self.pending[-1].done is not None:
            self.pending[-1].done.synchronize()
        for p in self.pending[:ready]:
            loss, hits = p.values.tolist()
            waited = p.wait.seconds() if p.wait is not None else 0.0
            self.info.data_wait_s += waited
            pace.waited(waited)
            record = {"kind": "iteration", "epoch": p.epoch, "iteration": p.iteration, "total": self.total,
                      "time_s": round(p.time_s, 4),
                      "loss": loss, "accuracy": hits / p.count if p.has_accuracy else None,
                      "learn_rate": p.learn_rate,
                      "samples_per_s": p.count / max(p.time_s - (self.last_time - self.start), 1e-9),
                      "data_wait_s": round(waited, 6)}
            self.last_time = self.start + p.time_s
            self.info.history.append(record)
            self.write(record)
        del self.pending[:ready]

    def add_validation(self, record: Record) -> None:
        """Record one validation result."""
        record = {"kind": "validation", **record, "time_s": round(self.elapsed(), 4)}
        self.info.validation_history.append(record)
        self.write(record)

    def write(self, record: Record) -> None:
        if self.folder:
            self.metrics.write(record)

    def print_row(self, record: Record, validation: Optional[Record]) -> None:
        if not self.header_printed:
            print(f"Training on {self.info.device}", file=self.out)
            print(HEADER, file=self.out)
            self.header_printed = True
        v = validation or {}
        self.last_row = record["iteration"]
        print(f"| {record['epoch']:7d} | {record['iteration']:11d} | {_clock(record['time_s']):>14s} | "
              f"{_pct(record['accuracy']):>12s} | {_pct(v.get('accuracy')):>12s} | {_num(record['loss']):>12s} | "
              f"{_num(v.get('loss')):>12s} | {record['learn_rate']:15.4e} |", file=self.out, flush=True)

    def update_views(self) -> None:
        """Redraw training-progress.png (atomically) when plots=training-progress, and append the records not
        yet in the run's (or this rank's) TensorBoard event file (the views' thread calls this; the lists are
        only appended to)."""
        history, validations = list(self.info.history), list(self.info.validation_history)
        self.facts.stop_reason = self.info.stop_reason
        if self.plots and self.folder and history:
            write_progress_plot(self.folder / PLOT, history, validations, self.facts)
        if self.events is None and tensorboard.available():
            self.events = tensorboard.EventLog(self.events_dir, time.time() - self.elapsed(), fresh=True)
        if self.events is not None:
            self.events.add(history, "iteration")
            self.events.add(validations, "validation")

    def finish(self, reason: str) -> None:
        """Flush everything, print the last iteration's row (with its validation) unless it was printed, note why
        training stopped, draw the final plot, close the metrics file."""
        self.flush()
        self.info.stop_reason = reason
        last = self.info.history[-1] if self.info.history else None
        if self.verbose and last is not None and last["iteration"] != self.last_row:
            validations = self.info.validation_history
            self.print_row(last, validations[-1] if validations and validations[-1]["iteration"] == last["iteration"]
                           else None)
        if self.verbose:
            print(f"Training finished: {reason}", file=self.out, flush=True)
        self.close()

    def close(self) -> None:
        """Draw the final plot and events from the records, stop the views' thread, close the files."""
        if self.views:
            self.views.close()
            if self.events is not None:
                self.events.close()
        if self.folder:
            self.metrics.close()

    def abandon(self, error: BaseException) -> None:
        """Training ended with ``error``: keep the records of the steps the device has finished (waiting for none:
        it may be what failed), then close as finish does, so that the records, the plot and the events so far
        stay readable and no thread of the views is left; a failure here is said, never raised in place of
        ``error``."""
        self.info.stop_reason = ended_by(error)
        try:
            self.flush(wait=False)
            self.close()
        except Exception:  # noqa: BLE001 - the run's own error is the one to raise
            print(f"[hpcdl] could not close the run's records after it {self.info.stop_reason}:\n"
                  f"{traceback.format_exc()}", file=sys.stderr, flush=True)
