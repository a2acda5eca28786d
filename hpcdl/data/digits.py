"""scikit-learn's bundled 8x8 digits written once as real PNG files in class folders."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Optional

import numpy as np
from PIL import Image

DEFAULT_ROOT = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "hpcdl" / "digits"


def digits_folder(root: Optional[str | os.PathLike] = None) -> Path:
    """Return a folder of ``<digit>/<n>.png`` images, writing it first if it is not there."""
    root = Path(root).expanduser() if root else DEFAULT_ROOT
    if (root / "0").is_dir():
        return root
    from sklearn.datasets import load_digits  # ships the images; nothing is downloaded

    digits = load_digits()
    root.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".digits-", dir=root.parent))
    for n, (pixels, label) in enumerate(zip(digits.images, digits.target)):
        folder = staging / str(label)
        folder.mkdir(exist_ok=True)
        grey = (pixels * (255.0 / 16.0)).round().astype(np.uint8)
        Image.fromarray(grey, mode="L").save(folder / f"{n:04d}.png")
    try:
        staging.rename(root)  # atomic: readers see all of the folder or none of it
    except OSError:
        shutil.rmtree(staging)  # another process wrote it first
    return root
