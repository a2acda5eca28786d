"""Checkpoints: one file per save, written atomically; resume takes the newest complete one.

Temporary files of a writer that was killed mid-save are removed by the next save or resume.
A deleted job folder is not made again: saving into it raises FolderGoneError.

Files load with ``torch.load(weights_only=True)``: tensors, numbers, strings,
lists and dicts only, so a checkpoint cannot run code when it is read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch
from torch import nn

from hpcdl.store.atomic import atomic_save, make_folder, remove_stale_temporaries
from hpcdl.train.progress import TrainingInfo
from hpcdl.train.validation import BestValidation

PATTERN = re.compile(r"^checkpoint-(\d{9})\.pt$")
KEEP = 2


def checkpoint_file(folder: Path, iteration: int) -> Path:
    """The file of the checkpoint taken after ``iteration``."""
    return folder / f"checkpoint-{iteration:09d}.pt"


def save_checkpoint(folder: str | Path, iteration: int, state: dict[str, Any]) -> Path:
    """Write ``state`` for ``iteration`` atomically; keep only the newest ``KEEP`` checkpoints."""
    folder = make_folder(folder)
    remove_stale_temporaries(folder)
    path = checkpoint_file(folder, iteration)
    atomic_save(path, lambda f: torch.save(state, f))
    for old in sorted(_checkpoints(folder))[:-KEEP]:
        old[1].unlink(missing_ok=True)
    return path


def _checkpoints(folder: Path) -> list[tuple[int, Path]]:
    found = []
    for path in folder.iterdir() if folder.is_dir() else ():
        match = PATTERN.match(path.name)
        if match:
            found.append((int(match.group(1)), path))
    return found


def load_latest_checkpoint(folder: Optional[str | Path]) -> Optional[dict[str, Any]]:
    """The newest checkpoint's state in ``folder``, or None when there is none."""
    if folder is None:
        return None
    remove_stale_temporaries(folder)
    found = sorted(_checkpoints(Path(folder)))
    if not found:
        return None
    return torch.load(found[-1][1], map_location="cpu", weights_only=True)


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
             scaler: torch.amp.GradScaler, device: torch.device, info: TrainingInfo) -> Path:
    """Checkpoint everything a resume needs after ``state.iteration``."""
    return save_checkpoint(folder, state.iteration, {
        "iteration": state.iteration, "elapsed_s": elapsed_s, "model": model.state_dict(),
        "optimizer": optimizer.state_dict(), "scaler": scaler.state_dict(), "rng_cpu": torch.get_rng_state(),
        "rng_cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
        "history": info.history, "validation_history": info.validation_history,
        "best_loss": state.best.loss, "bad_validations": state.best.bad_validations,
        "best_model": state.best.weights, "shuffle_seed": state.shuffle_seed})


def restore_run(folder: Optional[Path], state: RunState, model: nn.Module, optimizer: torch.optim.Optimizer,
                scaler: torch.amp.GradScaler, device: torch.device, info: TrainingInfo) -> bool:
    """Load the newest checkpoint in ``folder`` into the run's parts; False when there is none."""
    saved = load_latest_checkpoint(folder)
    if saved is None:
        return False
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    scaler.load_state_dict(saved["scaler"])
    torch.set_rng_state(saved["rng_cpu"])
    if device.type == "cuda" and saved["rng_cuda"] is not None:
        torch.cuda.set_rng_state(saved["rng_cuda"], device)
    info.history, info.validation_history = saved["history"], saved["validation_history"]
    state.iteration, state.elapsed_before, state.shuffle_seed = (saved["iteration"], saved["elapsed_s"],
                                                                 saved["shuffle_seed"])
    state.best.loss, state.best.bad_validations = saved["best_loss"], saved["bad_validations"]
    state.best.weights = saved["best_model"]
    return True
