"""Checkpoints: one file per save, written atomically with a SHA-256 beside it; resume takes the newest one
whose checksum holds, and says so in the log when it had to pass over a damaged one.

Temporary files of a writer that was killed mid-save are removed by the next save or resume.
A deleted job folder is not made again: saving into it raises FolderGoneError.

Files load with ``torch.load(weights_only=True)``: tensors, numbers, strings,
lists and dicts only, so a checkpoint cannot run code when it is read.
"""

from __future__ import annotations

import hashlib
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch
from torch import nn

from hpcdl.store.atomic import atomic_save, atomic_write_text, make_folder, remove_stale_temporaries
from hpcdl.store.files import checkpoint_file, checkpoint_files
from hpcdl.train.progress import TrainingInfo
from hpcdl.train.validation import BestValidation

CHUNK = 1 << 20


def checksum_file(checkpoint: Path) -> Path:
    """The file holding ``checkpoint``'s SHA-256; a checkpoint without one was never finished."""
    return checkpoint.with_suffix(".sha256")


def file_digest(path: Path) -> str:
    """The SHA-256 of ``path``'s bytes, in hex."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def save_checkpoint(folder: str | Path, iteration: int, state: dict[str, Any], keep: int = 2) -> Path:
    """Write ``state`` for ``iteration`` atomically, then its checksum; keep only the newest ``keep``."""
    folder = make_folder(folder)
    remove_stale_temporaries(folder)
    path = checkpoint_file(folder, iteration)
    atomic_save(path, lambda f: torch.save(state, f))
    atomic_write_text(checksum_file(path), file_digest(path) + "\n")
    for _, old in checkpoint_files(folder)[:-keep]:
        checksum_file(old).unlink(missing_ok=True)  # first: a checkpoint without its checksum is not used
        old.unlink(missing_ok=True)
    return path


def _damage(path: Path) -> Optional[str]:
    """Why the checkpoint at ``path`` cannot be trusted, or None when its checksum holds."""
    try:
        expected = checksum_file(path).read_text().strip()
    except FileNotFoundError:
        return "it has no checksum (its save did not finish)"
    actual = file_digest(path)
    return None if actual == expected else f"its SHA-256 is {actual[:12]}..., not {expected[:12]}..."


def load_latest_checkpoint(folder: Optional[str | Path]) -> Optional[dict[str, Any]]:
    """The state of the newest checkpoint in ``folder`` whose checksum holds, or None when there is none.

    Each damaged one passed over is named on stderr (the job's log).
    """
    if folder is None:
        return None
    remove_stale_temporaries(folder)
    for _, path in reversed(checkpoint_files(Path(folder))):
        problem = _damage(path)
        if problem is None:
            try:
                return torch.load(path, map_location="cpu", weights_only=True)
            except Exception as e:  # a checksum that holds over bytes torch cannot read
                problem = f"it does not load: {type(e).__name__}: {e}"
        print(f"[hpcdl] warning: checkpoint {path} is damaged ({problem}); using the one before it",
              file=sys.stderr, flush=True)
    return None


def random_states(device: torch.device) -> dict[str, Any]:
    """Every generator a run draws from: torch's (CPU and the device's), NumPy's and Python's."""
    kind, keys, position, has_gauss, cached = np.random.get_state()
    version, python_state, gauss_next = random.getstate()
    return {"torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
            "numpy": {"keys": torch.from_numpy(keys.astype(np.int64)), "position": int(position),
                      "has_gauss": int(has_gauss), "cached": float(cached)},
            "python": {"version": version, "state": torch.tensor(python_state, dtype=torch.int64),
                       "gauss_next": gauss_next}}


def set_random_states(states: dict[str, Any], device: torch.device) -> None:
    """Put back what ``random_states`` took."""
    torch.set_rng_state(states["torch"])
    if device.type == "cuda" and states["cuda"] is not None:
        torch.cuda.set_rng_state(states["cuda"], device)
    numpy = states["numpy"]
    np.random.set_state(("MT19937", numpy["keys"].numpy().astype(np.uint32), numpy["position"],
                         numpy["has_gauss"], numpy["cached"]))
    python = states["python"]
    random.setstate((python["version"], tuple(python["state"].tolist()), python["gauss_next"]))


@dataclass
class RunState:
    """What a run carries from one iteration to the next, and across a resume."""

    shuffle_seed: int
    """Seed of the epoch orders (drawn once when the options give none)."""
    best: BestValidation
    """The best validation so far."""
    iteration: int = 0
    """Iterations done."""
    elapsed_before: float = 0.0
    """Seconds of training before this process resumed."""


def save_run(folder: Path, state: RunState, elapsed_s: float, model: nn.Module, optimizer: torch.optim.Optimizer,
             scaler: torch.amp.GradScaler, device: torch.device, info: TrainingInfo, keep: int = 2) -> Path:
    """Checkpoint everything a resume needs after ``state.iteration``, keeping the newest ``keep``."""
    return save_checkpoint(folder, state.iteration, {
        "iteration": state.iteration, "elapsed_s": elapsed_s, "model": model.state_dict(),
        "optimizer": optimizer.state_dict(), "scaler": scaler.state_dict(), "random": random_states(device),
        "history": info.history, "validation_history": info.validation_history,
        "best_loss": state.best.loss, "bad_validations": state.best.bad_validations,
        "best_model": state.best.weights, "shuffle_seed": state.shuffle_seed}, keep)


def restore_run(folder: Optional[Path], state: RunState, model: nn.Module, optimizer: torch.optim.Optimizer,
                scaler: torch.amp.GradScaler, device: torch.device, info: TrainingInfo) -> bool:
    """Load the newest checkpoint in ``folder`` into the run's parts; False when there is none."""
    saved = load_latest_checkpoint(folder)
    if saved is None:
        return False
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    scaler.load_state_dict(saved["scaler"])
    set_random_states(saved["random"], device)
    info.history, info.validation_history = saved["history"], saved["validation_history"]
    state.iteration, state.elapsed_before, state.shuffle_seed = (saved["iteration"], saved["elapsed_s"],
                                                                 saved["shuffle_seed"])
    state.best.loss, state.best.bad_validations = saved["best_loss"], saved["bad_validations"]
    state.best.weights = saved["best_model"]
    return True


class CheckpointClock:
    """When checkpoints are due: every N iterations, at the end of every N epochs, or every N minutes."""

    def __init__(self, unit: Optional[str], every: int) -> None:
        self.unit, self.every = unit, every
        self.last = time.monotonic()

    def due_after_iteration(self, iteration: int) -> bool:
        """Whether to save after 1-based ``iteration``."""
        if self.unit == "iteration":
            return iteration % self.every == 0
        return self.unit == "minute" and time.monotonic() - self.last >= 60 * self.every

    def due_after_epoch(self, epoch: int) -> bool:
        """Whether to save at the end of 0-based ``epoch``."""
        return self.unit == "epoch" and (epoch + 1) % self.every == 0

    def saved(self) -> None:
        """Note that a checkpoint was just taken."""
        self.last = time.monotonic()
