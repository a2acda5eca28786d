"""Per-user caches kept in the store beside the jobs, so that a user's array tasks and resumes share them."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Optional

from hpcdl.store.safety import unsafe_reason

COMPILE_CACHE = ".compile-cache-{uid}"
"""torch.compile's cache (TORCHINDUCTOR_CACHE_DIR) in the store root: a dot-name, so never listed as a job."""


def compile_cache(root: Path) -> Optional[Path]:
    """This user's compile cache in store ``root``, made private if missing; None where it cannot be trusted.

    A compile cache holds code that is run: one another user made or can write (a planted folder in a shared
    store) is never used, and the run compiles without it."""
    path = root / COMPILE_CACHE.format(uid=os.getuid())
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return None
    try:
        info = os.lstat(path)
    except OSError:
        return None
    private = not info.st_mode & (stat.S_IRWXG | stat.S_IRWXO)
    return path if private and not unsafe_reason(info, stat.S_IFDIR) else None
