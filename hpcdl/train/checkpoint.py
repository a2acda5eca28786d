"""Checkpoints: one file per save, written atomically; resume takes the newest complete one.

Temporary files of a writer that was killed mid-save are removed by the next save or resume.
A deleted job folder is not made again: saving into it raises FolderGoneError.

Files load with ``torch.load(weights_only=True)``: tensors, numbers, strings,
lists and dicts only, so a checkpoint cannot run code when it is read.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Optional

import torch

from hpcdl.store.atomic import atomic_save, make_folder, remove_stale_temporaries

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
