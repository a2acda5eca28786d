"""What a client keeps of its remote jobs, in its own store's REMOTE folder: which login node each job is on,
and the last jobs list seen on each remote profile (shown, marked as such, while the login node is unreachable)."""

from __future__ import annotations

import json
import os
import re
import secrets
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from hpcdl.errors import HpcdlError
from hpcdl.remote.ssh import Login
from hpcdl.store.atomic import atomic_write_text
from hpcdl.store.files import REMOTE, REMOTE_JOB, REMOTE_LISTING, REMOTE_TREE
from hpcdl.store.folders import store_root
from hpcdl.store.safety import JOB_ID, UnsafeFolderError, check_job_key, open_own_folder, read_job_file

_SAFE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass(frozen=True)
class Site:
    """A remote profile as the client needs it: its name, its login node, the store there (null: its default)."""

    profile: str
    login: Login
    store: Optional[str]

    def to_dict(self) -> dict[str, Any]:
        return {"profile": self.profile, "login": self.login.to_dict(), "store": self.store}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Site":
        return cls(profile=data["profile"], login=Login.of(data["login"]), store=data.get("store"))


def _folder() -> Path:
    """This user's REMOTE folder in the store, made if missing, checked to be theirs alone (UnsafeFolderError
    when another user made it or may write it)."""
    folder = store_root() / REMOTE.format(uid=os.getuid())
    folder.parent.mkdir(parents=True, exist_ok=True)
    fd = open_own_folder(folder, create=True)
    if fd is None:
        raise FileNotFoundError(f"{folder}: removed as it was made")
    os.close(fd)
    return folder


def _folder_if_any() -> Optional[Path]:
    """This user's REMOTE folder checked as _folder does, or None when there is none yet."""
    folder = store_root() / REMOTE.format(uid=os.getuid())
    fd = open_own_folder(folder, create=False)
    if fd is None:
        return None
    os.close(fd)
    return folder


def _read(folder: Optional[Path], name: str) -> Optional[dict[str, Any]]:
    """A record of this user's REMOTE folder, read without following links and checked to be theirs alone;
    None when it is missing or not a JSON object."""
    data = read_job_file(folder, name) if folder is not None else None
    try:
        record = json.loads(data) if data is not None else None
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def remember_job(job_id: str, site: Site) -> None:
    """Note that job ``job_id`` lives on ``site`` (jobs commands given its id then go there)."""
    if not JOB_ID.match(job_id):
        raise HpcdlError(f"the login node answered {job_id!r}, not a job id")
    atomic_write_text(_folder() / REMOTE_JOB.format(id=job_id), json.dumps({"id": job_id, **site.to_dict()}))


def site_of(key: str) -> Optional[Site]:
    """The site of the remote job ``key`` names (its id or a unique prefix of one), or None: not a remote job."""
    check_job_key(key)
    try:
        folder = _folder_if_any()
    except UnsafeFolderError as e:  # planted by a co-user: its login nodes are never used
        print(f"[hpcdl] {e}: your remote jobs' records are not used", file=sys.stderr)
        return None
    prefix, suffix = REMOTE_JOB.split("{id}")
    found = sorted(name for name in (os.listdir(folder) if folder is not None else [])
                   if name.startswith(prefix + key) and name.endswith(suffix))
    record = _read(folder, found[0]) if len(found) == 1 else None
    return Site.from_dict(record) if record is not None else None


def _profile_name(pattern: str, profile: str) -> str:
    return pattern.format(profile=profile if _SAFE.match(profile) else "profile")


def sent_tree(site: Site) -> dict[str, Any]:
    """The code last sent to ``site``: {key: the tree's key there, files: name -> digest} (a new key, no files,
    the first time or when the login node moved)."""
    data = _read(_folder_if_any(), _profile_name(REMOTE_TREE, site.profile)) or {}
    if data.get("login") != site.login.to_dict() or data.get("store") != site.store:
        return {"key": secrets.token_hex(16), "files": {}}
    return {"key": data["key"], "files": data["files"]}


def remember_sent(site: Site, key: str, files: dict[str, str]) -> None:
    """Note the code tree ``files`` (name -> digest) that ``site`` now keeps under ``key``."""
    atomic_write_text(_folder() / _profile_name(REMOTE_TREE, site.profile), json.dumps(
        {"key": key, "files": files, "login": site.login.to_dict(), "store": site.store}))


def remember_listing(site: Site, text: str) -> None:
    """Keep ``text``, the jobs list just seen on ``site``."""
    atomic_write_text(_folder() / _profile_name(REMOTE_LISTING, site.profile),
                      json.dumps({"at": time.time(), "host": site.login.host, "text": text}))


def last_listing(site: Site) -> Optional[dict[str, Any]]:
    """The jobs list last seen on ``site`` ({at, host, text}), or None."""
    return _read(_folder_if_any(), _profile_name(REMOTE_LISTING, site.profile))


def remote_hint() -> Optional[str]:
    """One line for a jobs list of this store alone: how many jobs were submitted from here to login nodes, and
    the command that lists them (None when there are none)."""
    try:
        folder = _folder_if_any()
    except UnsafeFolderError:
        return None
    names = sorted(os.listdir(folder)) if folder is not None else []
    prefix, suffix = REMOTE_JOB.split("{id}")
    jobs = [name for name in names if name.startswith(prefix) and name.endswith(suffix)]
    if not jobs:
        return None
    profiles = sorted({profile for pattern in (REMOTE_LISTING, REMOTE_TREE) for name in names
                       if (profile := _profile_of(pattern, name)) is not None})
    if not profiles:
        newest = _read(folder, jobs[-1]) or {}
        profiles = [newest["profile"]] if _SAFE.match(str(newest.get("profile"))) else ["NAME"]
    return (f"note: {len(jobs)} job(s) were submitted from here to login nodes; list them with "
            + " or ".join(f"python -m hpcdl.jobs list cluster={p}" for p in profiles))


def _profile_of(pattern: str, name: str) -> Optional[str]:
    """The profile's name in a file name of ``pattern`` (REMOTE_LISTING, REMOTE_TREE), or None."""
    prefix, suffix = pattern.split("{profile}")
    profile = name[len(prefix):-len(suffix)] if name.startswith(prefix) and name.endswith(suffix) else None
    return profile if profile and _SAFE.match(profile) and profile != "profile" else None
