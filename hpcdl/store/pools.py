"""Held pools in a store: this user's POOLS folder, one folder per pool started (its record, the held job's
script and log, a mark per job submitted to it). Theirs alone: the folder is checked at every use, and a pool's
name is a plain word, so no name reaches a path or a script unchecked."""

from __future__ import annotations

import json
import os
import re
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from hpcdl.errors import ConfigError
from hpcdl.store.atomic import atomic_write_text
from hpcdl.store.files import POOL_JOB, POOL_RECORD, POOL_RELEASED, POOL_RELEASING, POOL_USED, POOLS
from hpcdl.store.safety import open_own_folder, read_job_file

_POOL_JOB_ID = re.compile(r"^[0-9]{6}-[0-9]{6}-[0-9a-f]{4}(_[0-9]+)?$")  # a job's id (JOB_ID), or a sweep point's
POOL_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,39}$")
"""A pool's name: a letter, then up to 39 letters, digits, '_' or '-'."""


def check_pool_name(name: str, option: str) -> None:
    """ConfigError naming ``option`` unless ``name`` is a pool's name (POOL_NAME)."""
    if not POOL_NAME.match(name):
        raise ConfigError(f"{option}: {name!r} is not a pool name (a letter, then up to 39 letters, digits, '_' "
                          "or '-')")


@dataclass
class PoolRecord:
    """One pool as started: ``backend_id`` is the held job's scheduler id; ``profile`` the cluster profile it was
    started with (a ClusterConfig as a dict)."""

    name: str
    folder: Path
    backend: str
    backend_id: str
    profile: dict[str, Any]
    idle_timeout_s: int
    started_at: float
    stopped_at: Optional[float] = None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "backend": self.backend, "backend_id": self.backend_id, "profile": self.profile,
                "idle_timeout_s": self.idle_timeout_s, "started_at": self.started_at, "stopped_at": self.stopped_at}

    @property
    def released(self) -> Optional[dict[str, Any]]:
        """What the holder wrote as it ended itself when idle, or None."""
        data = read_job_file(self.folder, POOL_RELEASED)
        return None if data is None else json.loads(data)

    def job_ids(self) -> list[str]:
        """The ids of the jobs submitted to this pool, oldest first."""
        prefix = POOL_JOB.format(id="")
        ids = [n[len(prefix):] for n in os.listdir(self.folder) if n.startswith(prefix)]
        return sorted(i for i in ids if _POOL_JOB_ID.match(i))


def pools_folder(root: Path, create: bool) -> Optional[Path]:
    """This user's POOLS folder in the store ``root``, checked to be theirs alone (made when ``create``); None when
    there is none."""
    folder = root / POOLS.format(uid=os.getuid())
    if create:
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = open_own_folder(folder, create)
    if fd is None:
        return None
    os.close(fd)
    return folder


def new_pool_folder(root: Path, name: str) -> Path:
    """An empty owner-only folder for a pool named ``name`` about to be started."""
    check_pool_name(name, "name")
    folder = pools_folder(root, create=True) / f"{name}.{secrets.token_hex(4)}"
    folder.mkdir(mode=0o700)
    return folder


def save_pool(pool: PoolRecord) -> None:
    """Write the pool's record, atomically."""
    atomic_write_text(pool.folder / POOL_RECORD, json.dumps(pool.to_dict(), indent=1, sort_keys=True) + "\n")


def load_pools(root: Path) -> list[PoolRecord]:
    """Every pool this user started in the store ``root``, oldest first (a folder without a record left out)."""
    folder = pools_folder(root, create=False)
    pools = []
    for entry in sorted(os.listdir(folder)) if folder is not None else ():
        name = entry.split(".")[0]
        if not POOL_NAME.match(name) or not (folder / entry).is_dir() or (folder / entry).is_symlink():
            continue
        data = read_job_file(folder / entry, POOL_RECORD)
        if data is None:
            continue
        record = json.loads(data)
        pools.append(PoolRecord(folder=folder / entry, **{k: record[k] for k in (
            "name", "backend", "backend_id", "profile", "idle_timeout_s", "started_at", "stopped_at")}))
    return sorted(pools, key=lambda pool: pool.started_at)


def find_pool(root: Path, key: str) -> PoolRecord:
    """The newest pool named ``key``, or the one whose scheduler id it is; ConfigError when there is none."""
    pools = [pool for pool in load_pools(root) if key in (pool.name, pool.backend_id)]
    if not pools:
        raise ConfigError(f"cluster.pool: no pool {key!r} in the store {root} (python -m hpcdl.pool list shows "
                          "yours; python -m hpcdl.pool start starts one)")
    return pools[-1]


RELEASING_WAIT_S = 10.0
"""The longest a submission waits for a holder that announced its release to release or go on."""


def claim_use(pool: PoolRecord) -> bool:
    """Touch the pool's use mark, then tell whether its holder still holds it: False once the holder has
    released it, or announced that it would before this touch (so a job is never handed to a pool that ends).

    The two sides' handshake: the holder reads the mark, announces (POOL_RELEASING), reads the mark again and
    releases only if it is unchanged; a submission touches the mark, then looks for the announcement. Whichever
    order the steps fall in, one side sees the other's: a touch before the holder's second read keeps the pool,
    one after it finds the announcement (or POOL_RELEASED, written before the announcement goes)."""
    (pool.folder / POOL_USED).touch(mode=0o600)
    deadline = time.monotonic() + RELEASING_WAIT_S
    while (pool.folder / POOL_RELEASING).exists() and time.monotonic() < deadline:
        time.sleep(0.05)  # the holder decides in milliseconds: released, or going on after this touch
    return not (pool.folder / POOL_RELEASING).exists() and not (pool.folder / POOL_RELEASED).exists()


def note_use(pool: PoolRecord, job_id: str) -> None:
    """Claim the pool for ``job_id`` (``claim_use``) and mark the job as submitted to it; ConfigError when its
    holder released it in the meantime."""
    if not claim_use(pool):
        raise ConfigError(f"cluster.pool: pool {pool.name} (scheduler id {pool.backend_id}) released its "
                          "allocation, idle, while the job was submitted; nothing was submitted: start it again "
                          "(python -m hpcdl.pool start)")
    (pool.folder / POOL_JOB.format(id=job_id)).touch(mode=0o600)
