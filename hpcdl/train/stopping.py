"""Stopping on a signal: the scheduler's warning before a time limit or a preemption (USR2 by default).

The handler only notes the signal. After each iteration the computing workers
agree on the host whether any of them got it, so that all stop after the same
iteration; the run then checkpoints and ends with StopRequested, which the job
turns into a requeue or a resumable stopped state.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Any

from hpcdl.errors import HpcdlError

STOP_SIGNAL = signal.SIGUSR2
"""The signal Slurm sends ahead of the time limit (``--signal=USR2@signal_delay_s``); never USR1, which NCCL
may take."""

_received = threading.Event()


class StopRequested(HpcdlError):
    """Training stopped on the stop signal after a checkpoint; resuming continues from it."""

    def __init__(self, iteration: int) -> None:
        super().__init__(f"stopped on {STOP_SIGNAL.name} after iteration {iteration}, checkpoint saved")
        self.iteration = iteration


def ended_by(error: BaseException) -> str:
    """How a run that raised ``error`` ended, in the words its views give (the plot's title, its stop reason)."""
    return "stopped" if isinstance(error, StopRequested) else f"failed ({type(error).__name__})"


def _note(_signum: int, _frame: Any) -> None:
    _received.set()


def listen_for_stop() -> None:
    """Note the stop signal from now on in this process (replacing, for instance, submitit's handler)."""
    signal.signal(STOP_SIGNAL, _note)


_warned = threading.Event()


def warn_if_signal_too_late(checkpoint_s: float) -> None:
    """Warn once in the log when a checkpoint takes more than half the time the stop signal leaves
    (HPCDL_SIGNAL_DELAY_S, set for jobs from the profile's signal_delay_s)."""
    lead = float(os.environ.get("HPCDL_SIGNAL_DELAY_S", "0"))
    if lead and checkpoint_s > lead / 2 and not _warned.is_set():
        _warned.set()
        print(f"[hpcdl] warning: a checkpoint took {checkpoint_s:.1f} s, more than half of the "
              f"{lead:.0f} s the stop signal leaves before the time limit: raise cluster.signal_delay_s",
              file=sys.stderr, flush=True)


def stop_requested() -> bool:
    """Whether this process got the stop signal."""
    return _received.is_set()
