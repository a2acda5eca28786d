"""Held pools from the login node: start one, list them, stop one; and a job sent to a pool, checked against it.

A pool is one allocation its backend holds (a held Slurm job that sleeps) until it has been idle for its idle
timeout, its time limit ends, or ``stop_pool`` releases it. Jobs given ``cluster.pool`` run in it with no queue
wait, several at once while they fit; a job that asks for more than the pool has (nodes, CPUs, GPUs, the time it
has left) is refused before anything is written.
"""

from __future__ import annotations

import dataclasses
import shutil
import time
from dataclasses import dataclass
from typing import Optional

from hpcdl.cluster import backend_for
from hpcdl.config import ClusterConfig
from hpcdl.errors import ConfigError, SubmissionError
from hpcdl.plan import JobPlan
from hpcdl.store.folders import load_record, store_root
from hpcdl.store.pools import (PoolRecord, check_pool_name, claim_use, find_pool, load_pools, new_pool_folder,
                               save_pool)
from hpcdl.store.states import CANCELLED, PENDING, RELEASED, RUNNING, STOPPED, UNKNOWN
from hpcdl.store.status import withdraw_final, write_final

START_POLL_S = 0.5


@dataclass
class PoolView:
    """A pool as a listing shows it: its record, its state now and the seconds it has left (None: unknown)."""

    record: PoolRecord
    state: str
    seconds_left: Optional[int]


def _views(pools: list[PoolRecord]) -> list[PoolView]:
    """Each pool's state from one scheduler query per backend: the held job's while it lives; after it, STOPPED
    (pool stop), RELEASED (idle), or how the scheduler ended it."""
    known: dict[str, tuple[str, Optional[int]]] = {}
    for backend in {pool.backend for pool in pools}:
        ids = [pool.backend_id for pool in pools if pool.backend == backend]
        try:
            known.update(backend_for(backend).pool_states(ids))
        except SubmissionError:  # the scheduler cannot be asked: said so per pool
            known.update({held: (f"{UNKNOWN} (the scheduler did not answer)", None) for held in ids})
    views = []
    for pool in pools:
        state, left = known.get(pool.backend_id, (UNKNOWN, None))
        if state.split()[0] not in (PENDING, RUNNING, UNKNOWN):
            state = STOPPED if pool.stopped_at else RELEASED if pool.released else state
        views.append(PoolView(pool, state, left if state == RUNNING else None))
    return views


def list_pools(profile: ClusterConfig) -> list[PoolView]:
    """This user's pools in the store of ``profile``, oldest first, with their states now."""
    return _views(load_pools(store_root(profile.store)))


def start_pool(profile: ClusterConfig, name: str, idle_timeout_s: int, wait_s: float) -> PoolView:
    """Hold an allocation of ``profile`` as the pool ``name`` (a live pool of that name is refused); wait at most
    ``wait_s`` for it to run. Returns it as it stands then."""
    check_pool_name(name, "name")
    if profile.pool is not None:
        raise ConfigError("cluster.pool: a pool is not started inside another pool")
    if profile.remote.host is not None:
        raise ConfigError(f"cluster={profile.name}: a pool is held from the login node ({profile.remote.host}); "
                          "start it there, then submit to it from here with cluster.pool=NAME")
    if idle_timeout_s < 10:
        raise ConfigError(f"idle_timeout: {idle_timeout_s} s is too short; give at least 10 s")
    backend = backend_for(profile.backend)
    backend.check_profile(profile)
    root = store_root(profile.store)
    live = [v for v in _views([p for p in load_pools(root) if p.name == name])
            if v.state.split()[0] in (PENDING, RUNNING)]
    if live:
        raise ConfigError(f"name: pool {name!r} is {live[0].state} (scheduler id {live[0].record.backend_id}); "
                          f"stop it (python -m hpcdl.pool stop {name}) or choose another name")
    folder = new_pool_folder(root, name)
    try:
        held = backend.start_pool(profile, folder, name, idle_timeout_s)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)  # nothing half-started stays
        raise
    pool = PoolRecord(name=name, folder=folder, backend=profile.backend, backend_id=held,
                      profile=dataclasses.asdict(profile), idle_timeout_s=idle_timeout_s, started_at=time.time())
    save_pool(pool)
    deadline = time.monotonic() + wait_s
    while True:
        (view,) = _views([pool])
        if view.state.split()[0] != PENDING or time.monotonic() >= deadline:
            return view
        time.sleep(START_POLL_S)


def stop_pool(profile: ClusterConfig, key: str) -> tuple[PoolRecord, list[str]]:
    """Release the pool ``key`` (a name or the held job's id) now; its jobs that had not ended are recorded
    CANCELLED first (so that none records its own end on the way), and that is withdrawn if the scheduler
    refuses. Returns the pool and those jobs' ids."""
    root = store_root(profile.store)
    pool = find_pool(root, key)
    cancelled = []
    for job_id in pool.job_ids():
        record = load_record(root / job_id)
        if record is not None and not record.final and write_final(
                record.folder, CANCELLED, reason=f"its pool {pool.name} was stopped (python -m hpcdl.pool stop)"):
            cancelled.append(record.folder)
    try:
        backend_for(pool.backend).stop_pool(pool.backend_id)
    except BaseException:
        for folder in cancelled:
            withdraw_final(folder)
        raise
    pool.stopped_at = time.time()
    save_pool(pool)
    return pool, [folder.name for folder in cancelled]


def _fits(plan: JobPlan, pool: PoolRecord) -> None:
    """ConfigError naming the option the pool cannot give: more nodes, tasks x CPUs or GPUs per node."""
    job, held = plan.cluster, pool.profile
    where = f"pool {pool.name} holds"
    if job.nodes > held["nodes"]:
        raise ConfigError(f"cluster.nodes={job.nodes}: {where} {held['nodes']} node(s)")
    cpus, offered = job.tasks_per_node * (job.cpus_per_task or 1), held["tasks_per_node"] * (held["cpus_per_task"] or 1)
    if cpus > offered:
        raise ConfigError(f"cluster.tasks_per_node x cpus_per_task = {cpus}: {where} {offered} CPU(s) per node")
    if job.gpus_per_node > held["gpus_per_node"]:
        raise ConfigError(f"cluster.gpus_per_node={job.gpus_per_node}: {where} {held['gpus_per_node']} GPU(s) "
                          "per node")


def _clock(seconds: int) -> str:
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def on_pool(plan: JobPlan, claim: bool = True) -> tuple[JobPlan, Optional[PoolRecord]]:
    """``plan`` as it runs on its pool (``cluster.pool`` named it; now the held job's id, no requeue and no
    preflight of its own: the pool's allocation is the job's) and the pool; ``plan`` itself and None without
    a pool. ConfigError for a pool that does not run, or a job it cannot hold. ``claim``: the pool is claimed
    (``claim_use``: its holder does not release it for its idle timeout); a dry run only looks."""
    profile = plan.cluster
    if profile.pool is None:
        return plan, None
    pool = find_pool(store_root(profile.store), profile.pool)
    if pool.backend != profile.backend:
        raise ConfigError(f"cluster.pool: pool {pool.name} is held by backend {pool.backend}, not "
                          f"{profile.backend}; submit with its profile (cluster={pool.profile['name']})")
    (view,) = _views([pool]) if not claim or claim_use(pool) else (PoolView(pool, RELEASED, None),)
    if view.state != RUNNING:
        raise ConfigError(f"cluster.pool: pool {pool.name} (scheduler id {pool.backend_id}) is {view.state}, not "
                          f"running; start one: python -m hpcdl.pool start cluster={pool.profile['name']}")
    _fits(plan, pool)
    left = view.seconds_left
    if left is not None and plan.time_limit_s > left:
        raise ConfigError(f"cluster.time={profile.time}: pool {pool.name} has {_clock(left)} left; ask for less "
                          "or start a pool with a longer time")
    held = dataclasses.replace(profile, pool=pool.backend_id, max_requeues=0, preflight="off")
    return dataclasses.replace(plan, cluster=held), pool
