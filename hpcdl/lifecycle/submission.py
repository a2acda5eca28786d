"""Submitting: write a job into the store and hand it to its backend (python -m hpcdl.submit, hpcdl.batch)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from hpcdl.cluster import Backend, backend_for
from hpcdl.config import Config
from hpcdl.config.cluster import time_limit_seconds
from hpcdl.config.secrets import check_no_secret_values
from hpcdl.errors import ConfigError, SubmissionError
from hpcdl.host import process_id
from hpcdl.store.files import CHECKPOINTS, FINAL, FUNCTION, MANIFEST, checkpoint_files
from hpcdl.store.folders import JobRecord, new_job_folder, remember_root, remove_job_folder, store_root, write_json
from hpcdl.plan import JobPlan, resolve, resolve_function
from hpcdl.snapshot import take_snapshot
from hpcdl.lifecycle.job import Job
from hpcdl.lifecycle.pools import on_pool
from hpcdl.store.pools import PoolRecord, note_use
from hpcdl.store.states import CANCELLED, FAILED, LOST, NODE_FAIL, PENDING, STOPPED, TIMEOUT
from hpcdl.store.status import forget_ranks_of_last_run


def git_commit(cwd: Path) -> Optional[dict[str, Any]]:
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


def plan_job(config: Config, script_args: Sequence[str] = ()) -> JobPlan:
    """The plan of ``config`` as its profile's backend runs it (the GPUs of this machine, or of the profile);
    ConfigError first for what of the profile the backend cannot honour."""
    backend = backend_for(config.cluster.backend)
    backend.check_profile(config.cluster)
    return resolve(config, runs_here=backend.runs_here, script_args=script_args)


def runs_user_code(plan: JobPlan) -> bool:
    """Whether the job runs the user's code (and so runs from a snapshot of it, when the profile says so)."""
    if not plan.cluster.snapshot:
        return False
    config = plan.config
    return plan.kind != "train" or not (config.model.built_in and config.data.built_in
                                        and not config.training.own_loss and config.data.transform is None)


def job_manifest(job_id: str, plan: JobPlan, overrides: Sequence[str], code: Optional[dict[str, Any]],
                 git: Optional[dict[str, Any]] = None, **extra: Any) -> dict[str, Any]:
    """A job's manifest: its plan, overrides, code snapshot, when, from where, at which commit (``git``:
    already asked, for a sweep's points)."""
    return {
        "snapshot": code, "id": job_id, "name": plan.name, "kind": plan.kind, "profile": plan.cluster.name,
        "plan": plan.to_dict(), "overrides": list(overrides), "submitted_at": time.time(),
        "git": git if git is not None else git_commit(Path.cwd()),
        "submitted_from": {"cwd": os.getcwd(), "host": os.uname().nodename, "process": process_id(os.getpid())},
        **extra,
    }


def left_out(backend: Backend, root: Path) -> dict[str, Any]:
    """The manifest's record of the nodes the backend leaves out of a submission now ({"excluded": {node:
    reason}}), nothing when it leaves none out."""
    excluded = backend.left_out(root)
    return {"excluded": excluded} if excluded else {}


def submit_job(plan: JobPlan, *, overrides: Sequence[str] = (),
               payload: Optional[tuple[Callable, tuple, dict]] = None) -> Job:
    """Write the job and its plan into the store and hand it to the backend; nothing stays if that fails.

    Until the backend's id is in the manifest, listings show the job SUBMITTING (while this process
    runs). A store that cannot be written (read-only, full) raises SubmissionError naming it.
    """
    check_no_secret_values(list(overrides), "overrides", plan.cluster.secrets)
    plan, pool = on_pool(plan)
    backend = backend_for(plan.cluster.backend)
    backend.check(plan)
    root = store_root(plan.cluster.store)
    folder, stage = None, "store"
    try:
        job_id, folder = new_job_folder(root)
        if payload is not None:
            import cloudpickle

            from hpcdl.store.atomic import atomic_save

            atomic_save(folder / FUNCTION, lambda f: cloudpickle.dump(payload, f))
        code = take_snapshot(Path.cwd(), folder, plan.cluster.snapshot_limit_mb) if runs_user_code(plan) else None
        manifest = job_manifest(job_id, plan, overrides, code, **left_out(backend, root), **pool_note(pool))
        write_json(folder / MANIFEST, manifest)
        if pool is not None:
            note_use(pool, job_id)
        stage = "backend"
        manifest["backend_id"] = backend.submit(plan, folder)
        stage = "store"
        write_json(folder / MANIFEST, manifest)
    except BaseException as e:
        if folder is not None:
            remove_job_folder(folder)
        if stage == "store" and isinstance(e, OSError):
            raise SubmissionError(f"cannot write the job store {root}: {e.strerror or e}; nothing was "
                                  "submitted") from e
        raise
    remember_root(root)
    return Job(JobRecord(folder, manifest, {}, state=PENDING))


def pool_note(pool: Optional[PoolRecord]) -> dict[str, Any]:
    """What a job's manifest says of the pool it runs on: its name and held job (nothing without one)."""
    return {} if pool is None else {"pool": {"name": pool.name, "id": pool.backend_id}}


RESUMABLE = (TIMEOUT, STOPPED, FAILED, CANCELLED, NODE_FAIL, LOST)
"""Final states a training job may go on from (its checkpoint is kept in the job folder)."""


def resume_job(job: Job, time_limit: Optional[str] = None) -> Job:
    """Submit a stopped training job again in the same record: it goes on from its newest valid checkpoint.

    ``time_limit`` (Slurm's format) replaces the profile's. The previous end is kept in the manifest's
    ``resumes``; until the backend has the job again it lists as SUBMITTING.
    """
    record = job.refresh()
    kind = record.manifest.get("kind")
    if kind not in ("train", "entry", "script", "function"):
        raise SubmissionError(f"job {job.id}: a {kind} does not resume; its points do, one by one")
    if kind != "train" and not checkpoint_files(record.folder / CHECKPOINTS):
        raise SubmissionError(f"job {job.id} saved no checkpoint (hpcdl.save_checkpoint): submit it again instead")
    if record.state not in RESUMABLE:
        raise SubmissionError(f"job {job.id} is {record.state}: only a job that ended {', '.join(RESUMABLE)} resumes")
    plan = JobPlan.from_dict(record.manifest["plan"])
    if time_limit is not None:
        profile = dataclasses.replace(plan.cluster, time=time_limit)  # the profile's own check of the value
        plan = dataclasses.replace(plan, cluster=profile, time_limit_s=time_limit_seconds(time_limit))
    plan, pool = on_pool(plan)
    backend = backend_for(plan.cluster.backend)
    backend.check(plan)
    manifest = {**record.manifest, **pool_note(pool)}
    manifest.pop("excluded", None)
    manifest.update(left_out(backend, record.folder.parent))
    if pool is not None:
        note_use(pool, job.id)
    if isinstance(manifest.get("sweep"), dict):  # a sweep's point goes on as a job of its own, not its runner's
        manifest["sweep"] = {**manifest["sweep"], "runner": False}
    previous = {"at": time.time(), "after": record.state, "reason": record.reason,
                "backend_id": manifest.pop("backend_id", None), "time": plan.cluster.time}
    manifest.update(plan=plan.to_dict(), resumes=[*manifest.get("resumes", []), previous],
                    submitted_from={**manifest["submitted_from"], "process": process_id(os.getpid())})
    write_json(record.folder / MANIFEST, manifest)
    forget_ranks_of_last_run(record.folder)
    (record.folder / FINAL).unlink(missing_ok=True)  # the job is SUBMITTING again, then runs
    manifest["backend_id"] = backend.submit(plan, record.folder)
    write_json(record.folder / MANIFEST, manifest)
    return Job(JobRecord(record.folder, manifest, {}, state=PENDING))


def batch(fn: Callable[..., Any], *args: Any, cluster: str = "local", name: Optional[str] = None,
          kwargs: Optional[dict[str, Any]] = None, all_ranks: bool = False, **resources: Any) -> Job:
    """Run ``fn(*args, **kwargs)`` as a job on the profile ``cluster`` (MATLAB's batch); returns at once.

    With several tasks (``nodes``, ``tasks_per_node``) every rank runs it, with torchrun's variables set; the
    result is rank 0's return value, or every rank's in rank order with ``all_ranks=True``.
    ``resources`` override the profile's settings (time="00:10:00", partition="gpu", gpus_per_node=1).
    """
    from hpcdl.config.compose import compose_config

    overrides = [f"cluster={cluster}"] + [f"cluster.{k}={json.dumps(v)}" for k, v in resources.items()]
    if not callable(fn):
        raise ConfigError(f"batch: fn must be callable, got {type(fn).__name__}")
    profile = compose_config(overrides).cluster
    plan = dataclasses.replace(resolve_function(profile, name or getattr(fn, "__name__", "batch")),
                               gather_results=all_ranks)
    return submit_job(plan, payload=(fn, args, kwargs or {}))
