"""Code as submitted: the submitting folder's files are copied into the job folder, and the ranks run
from that copy, so edits made while the job waits in the queue do not change what it runs.

In a git work tree the files are exactly those git tracks (``git ls-files``): an untracked file, such
as a ``.env`` holding a token, is never copied, ignored or not; elsewhere every file, hidden files and
folders, __pycache__ and virtual environments left out. Links are not followed. Over the profile's ``snapshot_limit_mb`` the submission is refused.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from hpcdl.errors import SubmissionError
from hpcdl.store.files import CODE
from hpcdl.store.safety import check_job_key

SKIPPED_FOLDERS = ("__pycache__", "node_modules")


def _git_files(folder: Path) -> list[str] | None:
    """Files under ``folder`` that git tracks, or None outside a work tree."""
    try:
        listed = subprocess.run(["git", "ls-files", "--cached", "-z"], cwd=folder,
                                capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if listed.returncode != 0:
        return None
    return [name for name in listed.stdout.decode(errors="surrogateescape").split("\0") if name]


def _walked_files(folder: Path) -> list[str]:
    files = []
    for top, folders, names in os.walk(folder):
        folders[:] = [d for d in folders if not d.startswith(".") and d not in SKIPPED_FOLDERS
                      and not (Path(top, d) / "pyvenv.cfg").exists()]
        files += [os.path.relpath(os.path.join(top, n), folder) for n in names if not n.startswith(".")]
    return files


def code_files(folder: Path, leave_out: Path) -> list[str]:
    """The regular files of ``folder`` to snapshot (relative paths), none of them under ``leave_out``."""
    names = _git_files(folder)
    names = _walked_files(folder) if names is None else names
    kept = []
    for name in names:
        path = folder / name
        if path.is_symlink() or not path.is_file() or path.resolve().is_relative_to(leave_out):
            continue
        kept.append(name)
    return kept


def take_snapshot(source: Path, job_folder: Path, limit_mb: int) -> dict[str, Any]:
    """Copy the code of ``source`` into ``job_folder``/code; what was copied (files, bytes, from where).

    SubmissionError when the files exceed ``limit_mb`` (nothing is copied then).
    """
    names = code_files(source, job_folder.parent)
    sizes = {name: (source / name).stat().st_size for name in names}
    total = sum(sizes.values())
    if total > limit_mb * 2**20:
        largest = ", ".join(f"{n} ({s / 2**20:.1f} MB)" for n, s in sorted(sizes.items(), key=lambda x: -x[1])[:3])
        raise SubmissionError(f"the code snapshot of {source} would be {total / 2**20:.1f} MB, over "
                              f"cluster.snapshot_limit_mb={limit_mb} (largest: {largest}); list data in "
                              ".gitignore, raise the limit, or set cluster.snapshot=false")
    target = job_folder / CODE
    for name in names:
        (target / name).parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        shutil.copy2(source / name, target / name, follow_symlinks=False)
    return {"from": str(source), "files": len(names), "bytes": total}


def snapshot_folder(job_folder: Path, manifest: dict[str, Any]) -> Path:
    """Where the job's snapshot lies: its own folder's, or its sweep's (``in``: the sweep id), shared by the
    sweep's points."""
    shared = manifest["snapshot"].get("in")
    if shared:
        check_job_key(shared)
    return (job_folder.parent / shared if shared else job_folder) / CODE


def run_from_snapshot(job_folder: Path, manifest: dict[str, Any]) -> None:
    """On a rank: work in the job's code snapshot, and import from it first (when one was taken)."""
    if not manifest.get("snapshot"):
        return
    code = str(snapshot_folder(job_folder, manifest))
    os.chdir(code)
    sys.path.insert(0, code)


def in_snapshot(path: str, job_folder: Path, manifest: dict[str, Any]) -> str:
    """``path`` (a file of the submitting folder) as it lies in the snapshot, when one was taken."""
    snapshot = manifest.get("snapshot")
    if not snapshot or not Path(path).is_relative_to(snapshot["from"]):
        return path
    return str(snapshot_folder(job_folder, manifest) / Path(path).relative_to(snapshot["from"]))
