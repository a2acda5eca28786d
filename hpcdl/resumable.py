"""Checkpoints and the stop signal for your own code (``entry=``, ``script=``, ``hpcdl.batch``), as the trainer has
them::

    state = hpcdl.load_checkpoint()    # None on a first run; after a requeue or jobs resume, the newest valid one
    start = state["step"] if state else 0
    for step in range(start + 1, steps + 1):
        ...
        stop = hpcdl.stop_requested()  # on every rank at the same step: the ranks agree
        if stop or step % 100 == 0:
            hpcdl.save_checkpoint({"step": step, "model": model.state_dict()}, step=step)
        if stop:
            hpcdl.stop(step)           # Slurm requeues the job (while requeues are left), else it ends resumable

Checkpoints go to the job's checkpoints folder: rank 0 writes each atomically with its SHA-256 and keeps the
newest ``keep``, while the other ranks wait at a barrier when torch.distributed is initialized. A damaged newest
checkpoint is passed over with a warning in the log. They hold what ``torch.load(weights_only=True)`` reads:
tensors, numbers, strings, lists and dicts (state_dict()s, torch.get_rng_state()).

The stop signal is the scheduler's warning before a time limit or a preemption (USR2, ``cluster.signal_delay_s``
ahead; on the local profile hpcdl sends it). A script's rank gets it through a flag in the job folder, since the
worker process that runs the script takes the signal; the script itself never dies of it.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Optional

from hpcdl.distributed.env import global_rank
from hpcdl.distributed.heartbeat import run_token
from hpcdl.errors import HpcdlError
from hpcdl.store.files import CHECKPOINTS, STOP_FLAG, STOPPED_AT
from hpcdl.train.stopping import StopRequested, stop_requested as signal_received

SCRIPT_RANK = "HPCDL_SCRIPT_RANK"
"""Set for a script's process: its stop signal arrives as STOP_FLAG."""
FLAG_CHECK_S = 0.5
"""How often a script's stop_requested() looks for STOP_FLAG, at most."""


class NotInAJob(HpcdlError):
    """A checkpoint or stop function was called outside a job."""


def _job_folder() -> Path:
    folder = os.environ.get("HPCDL_JOB_FOLDER")
    if not folder:
        raise NotInAJob("hpcdl checkpoints and stops exist only inside a job (HPCDL_JOB_FOLDER is not set)")
    return Path(folder)


def _distributed() -> Any:
    """torch.distributed when this process is in an initialized process group, else None."""
    if "torch" not in sys.modules:
        return None
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


def load_checkpoint() -> Optional[dict[str, Any]]:
    """The state of this job's newest valid checkpoint, or None when it has none (a first run)."""
    from hpcdl.train.checkpoint import load_latest_checkpoint

    return load_latest_checkpoint(_job_folder() / CHECKPOINTS)


def save_checkpoint(state: dict[str, Any], step: int, keep: int = 2) -> None:
    """Save ``state`` as the checkpoint after ``step`` (rank 0 writes; every rank calls it)."""
    from hpcdl.train.checkpoint import save_checkpoint as save

    if not 0 <= step < 10**9 or keep < 1:
        raise ValueError(f"hpcdl.save_checkpoint: step in [0, 1e9) and keep >= 1, got step={step} keep={keep}")
    folder = _job_folder() / CHECKPOINTS
    if global_rank() == 0:
        save(folder, step, state, keep)
    dist = _distributed()
    if dist is not None:
        dist.barrier()


class _StopFlag:
    """This run's STOP_FLAG in the job folder, read at most every FLAG_CHECK_S seconds."""

    def __init__(self) -> None:
        self.read_at, self.raised = 0.0, False

    def __call__(self) -> bool:
        now = time.monotonic()
        if not self.raised and now - self.read_at >= FLAG_CHECK_S:
            self.read_at = now
            try:
                self.raised = (_job_folder() / STOP_FLAG).read_text().strip() == run_token()
            except FileNotFoundError:
                pass
        return self.raised


_flag_raised = _StopFlag()


def stop_requested() -> bool:
    """Whether the stop signal reached this rank, or with torch.distributed initialized any rank (an all-reduce:
    call it at the same step on every rank; with NCCL, after torch.cuda.set_device(local_rank))."""
    received = _flag_raised() if os.environ.get(SCRIPT_RANK) else signal_received()
    dist = _distributed()
    if dist is None:
        return received
    import torch

    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
    flag = torch.tensor([int(received)], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def stop(step: int) -> None:
    """End this rank's run after ``step`` (saved with save_checkpoint): the job requeues itself on Slurm while
    ``cluster.max_requeues`` allows, otherwise it ends TIMEOUT (local) or STOPPED, and jobs resume goes on."""
    if not os.environ.get(SCRIPT_RANK):
        raise StopRequested(step)
    from hpcdl.store.atomic import atomic_write_text

    record = json.dumps({"run": run_token(), "step": step})
    atomic_write_text(_job_folder() / STOPPED_AT.format(rank=global_rank()), record)
    raise SystemExit(0)


def stopped_script_step(folder: Path) -> Optional[int]:
    """The step this run's script rank stopped after with ``stop``, or None when it did not."""
    try:
        record = json.loads((folder / STOPPED_AT.format(rank=global_rank())).read_text())
    except (FileNotFoundError, ValueError):
        return None
    return record["step"] if record.get("run") == run_token() else None
