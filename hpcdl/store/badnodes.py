"""The nodes that failed a preflight, remembered per user in the store for a while (cluster.preflight_hold_s),
so that the user's later Slurm jobs leave them out (sbatch --exclude).

The file is this user's own (mode 0600, read only when owned by the user and writable by no one else): another
user who can write to a shared store can neither add nodes to it nor take any away; a file that is not safe to
read is ignored, as is any entry that is not a plain node name with a time.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

from hpcdl.store.atomic import atomic_write_text
from hpcdl.store.files import BAD_NODES
from hpcdl.store.safety import UnsafeFolderError, read_job_file

NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
"""A node name as Slurm's node lists take it (no brackets, commas or paths)."""


def _read(root: Path) -> dict[str, dict[str, Any]]:
    try:
        data = read_job_file(root, BAD_NODES.format(uid=os.getuid()))
        found = json.loads(data) if data else {}
    except (OSError, ValueError, UnsafeFolderError):
        return {}
    if not isinstance(found, dict):
        return {}
    return {node: entry for node, entry in found.items() if isinstance(node, str) and NODE_NAME.match(node)
            and isinstance(entry, dict) and isinstance(entry.get("until"), (int, float))}


def remembered(root: Path, now: float | None = None) -> dict[str, dict[str, Any]]:
    """The nodes left out now: node -> {until, reason}."""
    now = time.time() if now is None else now
    return {node: entry for node, entry in _read(root).items() if entry["until"] > now}


def remember(root: Path, node: str, reason: str, hold_s: float) -> None:
    """Leave ``node`` out of this user's jobs for ``hold_s`` seconds (nothing when 0); ValueError for a name that
    is not a plain node name."""
    if not NODE_NAME.match(node):
        raise ValueError(f"{node!r} is not a node name")
    if hold_s <= 0:
        return
    nodes = remembered(root)
    nodes[node] = {"until": time.time() + hold_s, "reason": reason[:500]}
    atomic_write_text(root / BAD_NODES.format(uid=os.getuid()), json.dumps(nodes, indent=1, sort_keys=True) + "\n")
