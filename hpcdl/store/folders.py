"""The job store: one owner-only folder per job on a filesystem, no database server.

A job folder holds ``manifest.json`` (written at submission, atomically),
``status.json`` (written by the job itself: RUNNING, then COMPLETED or FAILED),
the logs, metrics, plot, checkpoints and results. A folder without a manifest
is not a job (a submission that failed removes its folder). Readers trust only
what a complete, atomically written file says.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from hpcdl.store.atomic import atomic_write_text
from hpcdl.store.changes import note_change
from hpcdl.errors import HpcdlError
from hpcdl.store.files import FINAL, MANIFEST, STATUS
from hpcdl.store.states import DAMAGED, FINAL_STATES, UNKNOWN
from hpcdl.store.safety import NotRegularFileError, check_store, open_folder, read_job_file

MANIFEST_KEYS = {"id": str, "name": str, "kind": str, "profile": str, "plan": dict, "submitted_at": (int, float)}
DEFAULT_ROOT = Path("~/.hpcdl/jobs")
ROOTS_FILE = Path("~/.hpcdl/stores")


def store_root(configured: Optional[str] = None) -> Path:
    """The store folder: the profile's ($VARS and ~ expanded), else $HPCDL_STORE, else ~/.hpcdl/jobs."""
    root = configured or os.environ.get("HPCDL_STORE") or str(DEFAULT_ROOT)
    return Path(os.path.expandvars(root)).expanduser().resolve()


def known_roots() -> list[Path]:
    """Every store this user has submitted to: the default one and those in ~/.hpcdl/stores."""
    roots = [store_root()]
    listing = ROOTS_FILE.expanduser()
    if listing.is_file():
        roots += [Path(line) for line in listing.read_text().splitlines() if line.strip()]
    return list(dict.fromkeys(r for r in roots if r.is_dir()))


def remember_root(root: Path) -> None:
    """Note a non-default store in ~/.hpcdl/stores so that listings find it from any shell."""
    if root == store_root() or root in known_roots():
        return
    listing = ROOTS_FILE.expanduser()
    listing.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with open(listing, "a") as f:
        f.write(f"{root}\n")


def new_job_folder(root: Path) -> tuple[str, Path]:
    """Create an empty owner-only job folder under ``root``; returns (job id, folder)."""
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    check_store(root)
    for _ in range(100):
        job_id = f"{time.strftime('%y%m%d-%H%M%S')}-{secrets.token_hex(2)}"
        try:
            return job_id, new_named_folder(root, job_id)
        except FileExistsError:
            continue
    raise HpcdlError(f"cannot create a job folder under {root}")


def new_named_folder(root: Path, name: str) -> Path:
    """Create the owner-only folder ``root``/``name`` (FileExistsError if it exists): a sweep's point."""
    folder = root / name
    folder.mkdir(mode=0o700)
    os.chmod(folder, 0o700)  # mkdir's mode is masked by the umask
    return folder


def remove_job_folder(folder: Path) -> None:
    """Remove a job folder whose submission failed: nothing half-written stays behind."""
    shutil.rmtree(folder, ignore_errors=True)


def write_json(path: Path, value: dict[str, Any]) -> None:
    """Write ``value`` as JSON, atomically (a job's manifest or status: marked changed for the store's index)."""
    atomic_write_text(path, json.dumps(value, indent=1, sort_keys=True) + "\n")
    if path.name in (MANIFEST, STATUS):
        note_change(path.parent)


def read_json(path: Path, folder_fd: Optional[int] = None) -> Optional[dict[str, Any]]:
    """A job file's JSON content (read safely: see hpcdl.store.safety), or None when it is missing;
    ``folder_fd``: its folder held open."""
    data = read_job_file(path.parent, path.name, folder_fd)
    return None if data is None else json.loads(data)


@dataclass
class JobRecord:
    """What the store knows of one job: its manifest, its status file and its resolved state."""

    folder: Path
    manifest: dict[str, Any]
    status: dict[str, Any]
    state: str = UNKNOWN
    reason: str = ""
    progress: Optional[dict[str, Any]] = None
    """The progress view (hpcdl.store.metrics.progress) when a listing took it from the store's index."""
    waiting_for: str = ""
    """Why the scheduler keeps a PENDING job waiting, in its own word (Slurm's: Resources, Priority, ...)."""

    @property
    def id(self) -> str:
        return self.folder.name

    @property
    def plan(self) -> dict[str, Any]:
        """The job plan as stored (a dict: the store's readers import no torch or hydra)."""
        return self.manifest["plan"]

    @property
    def backend(self) -> str:
        return self.plan["cluster"]["backend"]

    @property
    def backend_id(self) -> Optional[str]:
        return self.manifest.get("backend_id")

    @property
    def final(self) -> bool:
        return self.state in FINAL_STATES or self.state == DAMAGED


def _damage(manifest: Any, folder: Path) -> str:
    """What makes a parsed manifest unusable ('' when nothing does)."""
    if not isinstance(manifest, dict):
        return f"{MANIFEST}: not a JSON object"
    for key, kind in MANIFEST_KEYS.items():
        if not isinstance(manifest.get(key), kind):
            return f"{MANIFEST}: {key!r} is missing or of the wrong type"
    if manifest["id"] != folder.name:
        return f"{MANIFEST}: its id {manifest['id']!r} is not the folder's name"
    if not isinstance(manifest["plan"].get("cluster"), dict) or "backend" not in manifest["plan"]["cluster"]:
        return f"{MANIFEST}: the plan names no cluster backend"
    return ""


def load_record(folder: Path, store_fd: Optional[int] = None) -> Optional[JobRecord]:
    """The record of the job in ``folder`` (DAMAGED when its files cannot be read), or None without a manifest;
    ``store_fd``: a descriptor of the store held open, which the folder is opened from.

    A final state in final.json is the job's state; its fields are merged over status.json's. The files
    are read from one descriptor of the folder: a parent folder renamed away meanwhile cannot make a file
    that is there look missing (a false 'ended without a result').
    """
    files: dict[str, Any] = {}
    damage = ""
    try:
        folder_fd = open_folder(folder, store_fd)
    except FileNotFoundError:
        return None
    try:
        for name in (MANIFEST, STATUS, FINAL):
            try:
                files[name] = read_json(folder / name, folder_fd)
            except (OSError, ValueError, NotRegularFileError) as e:  # ValueError: bad JSON, bad UTF-8
                files[name], damage = {}, damage or f"{name}: cannot be read: {type(e).__name__}: {e}"
    finally:
        os.close(folder_fd)
    if files[MANIFEST] is None:
        return None
    files = {name: {} if value is None else value for name, value in files.items()}
    if not files[FINAL] and isinstance(files[STATUS], dict) and files[STATUS].get("state") in FINAL_STATES:
        files[FINAL] = files[STATUS]  # a job of a version before final.json recorded its end in status.json
    manifest = files[MANIFEST]
    damage = damage or _damage(manifest, folder) or next(
        (f"{name}: not a JSON object" for name in (STATUS, FINAL) if not isinstance(files[name], dict)), "")
    if damage:
        return JobRecord(folder, manifest if isinstance(manifest, dict) else {}, {}, DAMAGED, damage)
    record = JobRecord(folder, manifest, {**files[STATUS], **files[FINAL]})
    if files[FINAL].get("state") in FINAL_STATES:
        record.state, record.reason = files[FINAL]["state"], files[FINAL].get("reason", "")
    return record
