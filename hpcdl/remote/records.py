"""What a client keeps of its remote jobs, in its own store's REMOTE folder: which login node each job is on,
and the last jobs list seen on each remote profile (shown, marked as such, while the login node is unreachable)."""

from __future__ import annotations

import json
import re
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from hpcdl.errors import HpcdlError
from hpcdl.remote.ssh import Login
from hpcdl.store.atomic import atomic_write_text
from hpcdl.store.files import REMOTE, REMOTE_JOB, REMOTE_LISTING, REMOTE_TREE
from hpcdl.store.folders import store_root
from hpcdl.store.safety import JOB_ID, check_job_key

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
    folder = store_root() / REMOTE
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    return folder


def remember_job(job_id: str, site: Site) -> None:
    """Note that job ``job_id`` lives on ``site`` (jobs commands given its id then go there)."""
    if not JOB_ID.match(job_id):
        raise HpcdlError(f"the login node answered {job_id!r}, not a job id")
    atomic_write_text(_folder() / REMOTE_JOB.format(id=job_id), json.dumps({"id": job_id, **site.to_dict()}))


def site_of(key: str) -> Optional[Site]:
    """The site of the remote job ``key`` names (its id or a unique prefix of one), or None: not a remote job."""
    check_job_key(key)
    folder = store_root() / REMOTE
    found = sorted(folder.glob(REMOTE_JOB.format(id=key + "*"))) if folder.is_dir() else []
    if len(found) != 1:
        return None
    return Site.from_dict(json.loads(found[0].read_text()))


def _profile_file(pattern: str, profile: str) -> Path:
    return _folder() / pattern.format(profile=profile if _SAFE.match(profile) else "profile")


def _listing_file(profile: str) -> Path:
    return _profile_file(REMOTE_LISTING, profile)


def sent_tree(site: Site) -> dict[str, Any]:
    """The code last sent to ``site``: {key: the tree's key there, files: name -> digest} (a new key, no files,
    the first time or when the login node moved)."""
    path = _profile_file(REMOTE_TREE, site.profile)
    data = json.loads(path.read_text()) if path.is_file() else {}
    if data.get("login") != site.login.to_dict() or data.get("store") != site.store:
        return {"key": secrets.token_hex(16), "files": {}}
    return {"key": data["key"], "files": data["files"]}


def remember_sent(site: Site, key: str, files: dict[str, str]) -> None:
    """Note the code tree ``files`` (name -> digest) that ``site`` now keeps under ``key``."""
    atomic_write_text(_profile_file(REMOTE_TREE, site.profile), json.dumps(
        {"key": key, "files": files, "login": site.login.to_dict(), "store": site.store}))


def remember_listing(site: Site, text: str) -> None:
    """Keep ``text``, the jobs list just seen on ``site``."""
    atomic_write_text(_listing_file(site.profile), json.dumps({"at": time.time(), "host": site.login.host,
                                                               "text": text}))


def last_listing(site: Site) -> Optional[dict[str, Any]]:
    """The jobs list last seen on ``site`` ({at, host, text}), or None."""
    path = _listing_file(site.profile)
    return json.loads(path.read_text()) if path.is_file() else None
