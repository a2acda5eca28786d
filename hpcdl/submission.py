"""Submitting: write a job into the store and hand it to its backend (python -m hpcdl.submit, hpcdl.batch)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from hpcdl.cluster import backend_for
from hpcdl.config.cluster import ClusterConfig, is_secret
from hpcdl.errors import ConfigError
from hpcdl.store.files import FUNCTION, MANIFEST
from hpcdl.store.folders import JobRecord, new_job_folder, remember_root, remove_job_folder, store_root, write_json
from hpcdl.store.job import Job


def _git_commit(cwd: Path) -> Optional[dict[str, Any]]:
    """The commit (and whether the tree is dirty) of the code the job was submitted from."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=5)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                               capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return {"commit": head.stdout.strip(), "dirty": bool(dirty)}



def submit_job(kind: str, profile: ClusterConfig, name: str, *, config: Optional[dict[str, Any]] = None,
               overrides: Sequence[str] = (), payload: Optional[tuple[Callable, tuple, dict]] = None,
               world_size: int = 1, mpi: bool = False) -> Job:
    """Write the job into the store and hand it to the profile's backend; nothing stays if that fails."""
    backend = backend_for(profile.backend)
    backend.check(profile)
    root = store_root(profile.store)
    job_id, folder = new_job_folder(root)
    try:
        if payload is not None:
            import cloudpickle

            from hpcdl.store.atomic import atomic_save
            atomic_save(folder / FUNCTION, lambda f: cloudpickle.dump(payload, f))
        manifest = {
            "id": job_id, "name": name, "kind": kind, "profile": profile.name, "cluster": dataclasses.asdict(profile),
            "config": config, "overrides": [o for o in overrides if not is_secret(o.split("=")[0])],
            "submitted_at": time.time(), "submitted_from": {"cwd": os.getcwd(), "host": os.uname().nodename},
            "git": _git_commit(Path.cwd()), "world_size": world_size, "mpi": mpi,
        }
        write_json(folder / MANIFEST, manifest)
        manifest["backend_id"] = backend.submit(profile, folder, name, mpi)
        write_json(folder / MANIFEST, manifest)
    except BaseException:
        remove_job_folder(folder)
        raise
    remember_root(root)
    return Job(JobRecord(folder, manifest, {}, state="PENDING"))


def batch(fn: Callable[..., Any], *args: Any, cluster: str = "local", name: Optional[str] = None,
          kwargs: Optional[dict[str, Any]] = None, **resources: Any) -> Job:
    """Run ``fn(*args, **kwargs)`` as a job on the profile ``cluster`` (MATLAB's batch); returns at once.

    ``resources`` override the profile's settings (time="00:10:00", partition="gpu", gpus_per_node=1).
    """
    from hpcdl.config.compose import compose_config

    overrides = [f"cluster={cluster}"] + [f"cluster.{k}={json.dumps(v)}" for k, v in resources.items()]
    if not callable(fn):
        raise ConfigError(f"batch: fn must be callable, got {type(fn).__name__}")
    profile = compose_config(overrides).cluster
    job_name = name or getattr(fn, "__name__", "batch")
    return submit_job("function", profile, job_name, payload=(fn, args, kwargs or {}))
