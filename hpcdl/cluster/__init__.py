"""Where a job runs: one small interface, one module per backend.

A backend is the module ``hpcdl/cluster/<name>.py`` exporting ``BACKEND`` (its class), found by the name a
profile's ``backend`` holds; its config group is a profile ``hpcdl/conf/cluster/<name>.yaml`` naming it.
Code outside this package never asks which backend it has: it calls ``backend_for(name)`` and uses the
``Backend`` protocol. A backend starts a job's worker by its module name (WORKER), never by importing it:
the worker sits above the backends and asks its own (requeue, how a stopped job ends, the job's runs).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Protocol

from hpcdl.distributed.restarts import JobRuns
from hpcdl.errors import ConfigError

if TYPE_CHECKING:
    from hpcdl.config import ClusterConfig
    from hpcdl.plan import JobPlan
    from hpcdl.store.folders import JobRecord


WORKER = "hpcdl.worker"
"""The module a backend starts for a job folder (``python -m hpcdl.worker FOLDER``: hpcdl.worker.run_job)."""


class Backend(JobRuns, Protocol):
    """What every backend does: check a profile, show and submit a job, report states, cancel, find logs; and
    in the job, what its worker and ranks ask of the scheduler (requeue; this run, the job's id, whether it was
    queued again and how an earlier run ended: ``JobRuns``)."""

    name: str
    starts_ranks: bool
    """Whether the worker that submit starts launches the job's ranks itself and keeps its time limit (else the
    scheduler starts a worker per rank and ends the job at its limit)."""
    stop_state: str
    """The final state of a job that stopped on the stop signal with a checkpoint and was not queued again."""
    sweep_runner: bool
    """Whether a sweep's points always run under hpcdl's sweep runner (else a scheduler task each, unless packed)."""
    runs_here: bool
    """Whether the job runs on the submitting machine: its GPUs are this machine's (else the profile's
    gpus_per_node on each node)."""

    def check_profile(self, profile: "ClusterConfig") -> None:
        """ConfigError for a setting of the profile that this backend cannot honour (before any plan is made)."""

    def check(self, plan: "JobPlan", dry_run: bool = False) -> Optional[str]:
        """ConfigError for what the scheduler cannot run; in a dry run, a note when it could not be asked."""

    def preview(self, plan: "JobPlan", folder: Path) -> str:
        """The exact script (or command and environment) that submit would start."""

    def submit(self, plan: "JobPlan", folder: Path) -> str:
        """Start the job stored in ``folder``; returns the scheduler's id for it."""

    def submit_sweep(self, sweep: Path, points: list[tuple["JobPlan", Path]], parallelism: Optional[int],
                     points_per_task: int) -> tuple[list[str], str]:
        """Start a sweep's points (plans and folders); returns each point's scheduler id and the sweep's
        (what cancelling the whole sweep ends: Slurm array ids, or the local runner)."""

    def live_states(self, records: list["JobRecord"]) -> Optional[dict[str, Optional[str]]]:
        """The scheduler's state of each job it still knows (by hpcdl id); None when it cannot be asked.

        A job absent from the answer has ended; one mapped to None cannot be judged from here. A state may carry
        the scheduler's detail after a space: why a job is pending ('PENDING Priority'), who cancelled it.
        """

    def cancel(self, record: "JobRecord") -> None:
        """Stop the job."""

    def log_path(self, record: "JobRecord", rank: int, stream: str) -> Path:
        """Where rank ``rank``'s stdout or stderr is written."""

    def display_id(self, record: "JobRecord") -> str:
        """The scheduler's id of the job as a listing shows it: short, for people ('' before it has one)."""

    def describe(self, backend_id: str) -> str:
        """What a job's scheduler id names, in words ('Slurm job 12', 'process 4242')."""

    def describe_sweep(self, backend_id: str) -> str:
        """What a sweep was handed to, in words ('Slurm array(s) 12,13', 'a background runner on HOST')."""

    def start_pool(self, profile: "ClusterConfig", folder: Path, name: str, idle_timeout_s: int) -> str:
        """Hold an allocation of ``profile`` for later jobs (python -m hpcdl.pool), its files in ``folder``; it
        releases itself after ``idle_timeout_s`` without use. Returns the scheduler's id of the held job;
        ConfigError where this backend holds no pools."""

    def pool_states(self, ids: list[str]) -> dict[str, tuple[str, Optional[int]]]:
        """The scheduler's state of each held job (by its id) and the seconds it has left (None: no limit, or
        ended); an id the scheduler no longer knows is absent."""

    def stop_pool(self, backend_id: str) -> None:
        """Release the held job now: every job running on it ends."""

    def survey(self) -> list[str]:
        """What the cluster offers, in lines for people: Slurm's partitions and their limits, or this machine's."""

    def requeue(self, job: str) -> Optional[str]:
        """In the job: queue it (the scheduler's id ``job``) again to go on from its checkpoint; None once queued,
        else the scheduler's refusal in words."""

    def requeue_excluding(self, job: str, node: str) -> Optional[str]:
        """In the job: queue it again never to run on ``node`` (which failed its preflight); None once queued,
        else the refusal in words."""

    def left_out(self, root: Path) -> dict[str, str]:
        """The nodes this backend's submissions into the store ``root`` leave out now, each with why (the nodes
        that failed a preflight of this user's jobs lately); none where the backend cannot leave a node out."""

    def task_cpus(self) -> Optional[int]:
        """In the job: the CPUs the scheduler gave this task; None where it gives no count (the affinity mask
        tells)."""

    def single_task_environment(self, env: dict[str, str]) -> dict[str, str]:
        """In the job: ``env`` without the launcher's task variables, for a process that is a job of its own
        inside this task (a packed sweep point)."""


def backend_for(name: str) -> Backend:
    """The backend a profile's ``backend`` names: ``BACKEND`` of the module hpcdl.cluster.<name>; ConfigError for
    a name that names none."""
    if not name.isidentifier() or name.startswith("_"):
        raise ConfigError(f"cluster.backend: {name!r} is not a backend's name")
    try:
        module = importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as e:
        if e.name != f"{__name__}.{name}":
            raise  # the backend's module is there but needs what is missing
        module = None
    backend = getattr(module, "BACKEND", None)
    if backend is None:
        raise ConfigError(f"cluster.backend: {name!r} names no backend (a module hpcdl/cluster/{name}.py "
                          "exporting BACKEND)")
    return backend()
