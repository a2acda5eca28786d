"""Submitting a sweep: its points become jobs of one sweep record, handed to the scheduler at once.

On Slurm the points are job arrays (one sbatch per array); locally one background runner runs them.
Nothing is written before every point has been checked; a submission that fails leaves no folder, one
killed on the way a sweep listed INTERRUPTED that ``jobs cancel`` removes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from hpcdl.cluster import backend_for
from hpcdl.config.secrets import check_no_secret_values
from hpcdl.errors import ConfigError, SubmissionError
from hpcdl.plan import JobPlan
from hpcdl.snapshot import take_snapshot
from hpcdl.store.atomic import atomic_write_text, sync_filesystem, write_unsynced
from hpcdl.store.files import CANCELLED_MARK, FUNCTION, HYDRA_RECORD, MANIFEST, MULTIRUN
from hpcdl.store.folders import (JobRecord, new_job_folder, new_named_folder, remember_root, remove_job_folder,
                                 store_root, write_json)
from hpcdl.store.sweeps import SUBMITTING_MARK, SWEEP
from hpcdl.lifecycle.pools import on_pool
from hpcdl.lifecycle.submission import job_manifest, left_out, pool_note, runs_user_code
from hpcdl.store.pools import PoolRecord, note_use


@dataclass(frozen=True)
class SweepOptions:
    """How a sweep's points are handed to the scheduler."""

    parallelism: Optional[int] = None
    """Slurm: at most this many tasks of each array at once (``--array=...%k``); locally, this many points at
    once; None: as many as fit."""
    points_per_task: int = 1
    """Points packed into one Slurm array task (one allocation), run there several at once."""

    def __post_init__(self) -> None:
        if self.parallelism is not None and (isinstance(self.parallelism, bool) or self.parallelism < 1):
            raise ConfigError(f"hydra.launcher.parallelism: at least 1 point at once, got {self.parallelism}")
        if isinstance(self.points_per_task, bool) or self.points_per_task < 1:
            raise ConfigError(f"hydra.launcher.points_per_task: at least 1, got {self.points_per_task}")


@dataclass(frozen=True)
class SweepPoint:
    """One point of a sweep, checked and ready to submit."""

    num: int
    """Hydra's job number (hydra.job.num)."""
    plan: JobPlan
    overrides: tuple[str, ...]
    """The point's own overrides (Hydra's task overrides)."""
    hydra_files: dict[str, str] = field(default_factory=dict)
    """Hydra's record of the point: file name under .hydra/ -> YAML (config, hydra, overrides)."""
    output_dir: Optional[str] = None
    """Hydra's working folder of the point."""
    payload: Optional[tuple[Callable, tuple, dict]] = None
    """A function point's (fn, args, kwargs)."""


@dataclass
class Sweep:
    """A sweep being submitted: its folder and manifest, and the points added so far."""

    id: str
    folder: Path
    manifest: dict[str, Any]


def open_sweep(plan: JobPlan, name: str, overrides: Sequence[str], multirun_yaml: Optional[str]) -> Sweep:
    """Create the sweep's folder (its manifest marked as being submitted, Hydra's multirun.yaml) in the store of
    ``plan``'s profile."""
    root = store_root(plan.cluster.store)
    try:
        sweep_id, folder = new_job_folder(root)
    except OSError as e:
        raise SubmissionError(f"cannot write the job store {root}: {e.strerror or e}; nothing was submitted") from e
    manifest = {**job_manifest(sweep_id, plan, overrides, None), "kind": SWEEP, "name": name,
                "plan": {"cluster": dataclasses.asdict(plan.cluster)}, "points": [], "backend_id": None,
                SUBMITTING_MARK: 0}
    try:
        write_json(folder / MANIFEST, manifest)  # first: killed from here on, the sweep is listed INTERRUPTED
        if multirun_yaml is not None:
            atomic_write_text(folder / MULTIRUN, multirun_yaml)
    except BaseException:
        remove_job_folder(folder)
        raise
    return Sweep(sweep_id, folder, manifest)


def check_points(sweep: Sweep, points: Sequence[SweepPoint], options: SweepOptions) -> None:
    """ConfigError for points that cannot run as one sweep: on a backend or store other than the sweep's,
    multi-rank points packed, GPUs chosen by index for the local runner (it gives each point its own); a
    sweep cancelled takes no more points. Each distinct request is checked with the scheduler once."""
    if not points:
        raise ConfigError("the sweep has no points")
    if (sweep.folder / CANCELLED_MARK).exists():
        raise SubmissionError(f"sweep {sweep.id} was cancelled: it takes no more points")
    first = points[0].plan.cluster
    own = sweep.manifest["plan"]["cluster"]
    backend = backend_for(first.backend)
    for point in points:
        profile = point.plan.cluster
        if (profile.backend, profile.store) != (own["backend"], own["store"]):
            raise ConfigError(f"point {point.num} ({' '.join(point.overrides)}): a sweep runs on one cluster "
                              f"backend and store; it has {profile.backend} {profile.store or '(default store)'}, "
                              f"the sweep {own['backend']} {own['store'] or '(default store)'}")
        if backend.sweep_runner and point.plan.gpus is not None:
            raise ConfigError(f"training.gpus={list(point.plan.gpus)}: a local sweep gives each point GPUs of its "
                              "own (one per rank); leave training.gpus unset")
        if options.points_per_task > 1 and point.plan.world_size > 1:
            raise ConfigError(f"hydra.launcher.points_per_task={options.points_per_task}: point {point.num} "
                              f"runs on {point.plan.world_size} ranks; only single-rank points are packed")
        check_no_secret_values(list(point.overrides), "overrides", profile.secrets)
        if profile.pool != first.pool:
            raise ConfigError(f"point {point.num} ({' '.join(point.overrides)}): cluster.pool={profile.pool}, the "
                              f"sweep's first point {first.pool}; a sweep runs on one pool or none")
    if first.pool is not None and options.points_per_task > 1:
        raise ConfigError(f"hydra.launcher.points_per_task={options.points_per_task}: a pool's points run as steps "
                          "of it, side by side while they fit; leave it 1")
    if options.points_per_task > 1:
        _note_rounds(first, options.points_per_task)
    checked: set[str] = set()
    for point in points:
        key = json.dumps(dataclasses.asdict(point.plan.cluster), sort_keys=True) + str(point.plan.time_limit_s)
        if key not in checked:
            backend.check(point.plan)
            checked.add(key)


def _note_rounds(profile: Any, points_per_task: int) -> None:
    """Say on stderr when a packed task holds more points than it runs at once: they share one time limit."""
    slots = profile.gpus_per_node or profile.cpus_per_task or 1
    if points_per_task > slots:
        rounds = -(-points_per_task // slots)
        print(f"note: points_per_task={points_per_task} with {slots} slot(s) a task "
              f"({'GPUs' if profile.gpus_per_node else 'CPUs'}): each task runs its points in {rounds} rounds "
              f"within one time limit (cluster.time={profile.time})", file=sys.stderr)


def _on_pool(points: Sequence[SweepPoint]) -> tuple[list[SweepPoint], Optional[PoolRecord]]:
    """The points as they run on their pool (each distinct plan checked against it once), and the pool; the
    points as they are and None without one."""
    resolved: dict[int, JobPlan] = {}
    pool = None
    for point in points:
        if id(point.plan) not in resolved:
            resolved[id(point.plan)], pool = on_pool(point.plan)
    return [dataclasses.replace(p, plan=resolved[id(p.plan)]) for p in points], pool


def add_points(sweep: Sweep, points: Sequence[SweepPoint], options: SweepOptions) -> None:
    """Write the points into the store and hand them to the scheduler, as one submission.

    The sweep's manifest names every point first, marked as a submission under way (``SUBMITTING_MARK``), then the
    points are written in bulk (one sync for all), handed over, and the mark removed. If anything fails here,
    what was written is removed (the points first) and the sweep's manifest is as it was; a submitter killed
    on the way leaves a sweep its id names, INTERRUPTED, whose points never run (hpcdl.store.sweeps).
    """
    root, before = sweep.folder.parent, dict(sweep.manifest)
    created: list[Path] = []
    handed_to: Optional[JobRecord] = None
    try:
        check_points(sweep, points, options)
        points, pool = _on_pool(points)
        backend = backend_for(points[0].plan.cluster.backend)
        runner = backend.sweep_runner or options.points_per_task > 1
        code = sweep.manifest.get("snapshot")
        if code is None and any(runs_user_code(p.plan) for p in points):
            code = take_snapshot(Path.cwd(), sweep.folder, points[0].plan.cluster.snapshot_limit_mb)
            sweep.manifest["snapshot"] = code
        ids = [f"{sweep.id}_{point.num}" for point in points]
        sweep.manifest.update(points=[*before["points"], *ids], **{SUBMITTING_MARK: len(ids)})
        write_json(sweep.folder / MANIFEST, sweep.manifest)
        manifests = []
        common: dict[int, dict[str, Any]] = {}  # one manifest body per distinct plan, not a plan.to_dict() a point
        git = sweep.manifest.get("git") or {}  # asked once, for the sweep
        excluded = left_out(backend, root)
        for point, point_id in zip(points, ids):
            folder = new_named_folder(root, point_id)
            created.append(folder)
            _write_point_files(folder, point)
            shared = {**code, "in": sweep.id} if code and runs_user_code(point.plan) else None
            if id(point.plan) not in common:
                common[id(point.plan)] = job_manifest(point_id, point.plan, (), shared, git, **excluded)
            manifest = {**common[id(point.plan)], "id": point_id, "overrides": list(point.overrides),
                        "output_dir": point.output_dir,
                        "sweep": {"id": sweep.id, "num": point.num, "overrides": list(point.overrides),
                                  "runner": runner}, **pool_note(pool)}
            write_unsynced(folder / MANIFEST, _json(manifest))
            manifests.append(manifest)
            if pool is not None:
                note_use(pool, point_id)
        sync_filesystem(root)
        point_ids, handed = backend.submit_sweep(sweep.folder, [(p.plan, f) for p, f in zip(points, created)],
                                                 options.parallelism, options.points_per_task)
        handed_to = JobRecord(sweep.folder, {**sweep.manifest, "backend_id": handed}, {})
        sweep.manifest["backend_id"] = ",".join(filter(None, [sweep.manifest.get("backend_id"), handed]))
        write_json(sweep.folder / MANIFEST, sweep.manifest)  # names what the scheduler has, before the points
        for folder, manifest, backend_id in zip(created, manifests, point_ids):
            manifest["backend_id"] = backend_id  # a point runs once its manifest has it (hpcdl.store.sweeps)
            write_unsynced(folder / MANIFEST, _json(manifest))
        sync_filesystem(root)
        del sweep.manifest[SUBMITTING_MARK]
        write_json(sweep.folder / MANIFEST, sweep.manifest)
    except BaseException as e:
        if handed_to is not None:  # the scheduler has them, their record failed: they must not run unseen
            with contextlib.suppress(Exception):
                backend.cancel(handed_to)
        for folder in created:
            remove_job_folder(folder)
        sweep.manifest = before
        if not before["points"]:  # the sweep's own folder last: cut short, what is left is named by it
            remove_job_folder(sweep.folder)
        else:
            write_json(sweep.folder / MANIFEST, before)
        if isinstance(e, OSError) and not isinstance(e, SubmissionError):
            raise SubmissionError(f"cannot write the job store {root}: {e.strerror or e}; nothing was "
                                  "submitted") from e
        raise
    remember_root(root)


def _json(value: dict[str, Any]) -> bytes:
    return (json.dumps(value, indent=1, sort_keys=True) + "\n").encode()


def _write_point_files(folder: Path, point: SweepPoint) -> None:
    if point.payload is not None:
        import cloudpickle

        write_unsynced(folder / FUNCTION, cloudpickle.dumps(point.payload))
    if point.hydra_files:
        (folder / HYDRA_RECORD).mkdir(mode=0o700)
        for name, text in point.hydra_files.items():
            write_unsynced(folder / HYDRA_RECORD / name, text.encode())
