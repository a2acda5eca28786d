"""resolve(config) -> JobPlan: every rule of a job, checked once at the edge, before anything is written.

The plan is frozen, stored once in the job's manifest and read by every rank,
which neither re-validates nor re-derives it (``JobPlan.from_dict`` builds the
sections without running their checks: they ran when the plan was made).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from hpcdl.config.environment import exported_environment, job_environment
from hpcdl.config import ClusterConfig, Config, TrainingOptions
from hpcdl.config.cluster import time_limit_seconds
from hpcdl.config.root import check_job_name
from hpcdl.config.secrets import check_no_secret_values, check_secrets_set
from hpcdl.config.fields import restore
from hpcdl.distributed.shares import RankShares, resolve_ranks
from hpcdl.errors import ConfigError

KINDS = ("train", "function", "entry", "script")
DEVICES = ("cpu", "gpu", "auto")
HANG_SHARE_OF_COLLECTIVE = 0.8
"""The built-in trainer's hang limit as a share of its collective timeout (JobPlan.hang_limit_s)."""
HANG_MARGIN_S = 20
"""...and at least this many seconds under it: a tick of the watcher and its wait for the stacks (10 s)."""
HANG_FLOOR_S = 15
"""...and never under this: three heartbeats of the longest tick (5 s), so that a late tick is no hang."""


@dataclass(frozen=True)
class JobPlan:
    """A job as it will run: what, where, how many ranks and how they share the work."""

    kind: str
    """train (the built-in trainer on ``config``), function (hpcdl.batch), entry or script (your own code)."""
    name: str
    """The job's name, a single line."""
    cluster: ClusterConfig
    """The profile as submitted; for multi-gpu, one task per selected GPU."""
    config: Optional[Config] = None
    """The whole config tree of a training job."""
    world_size: int = 1
    """Ranks in all."""
    lead_rank: int = 0
    """The rank that reports the job's state, prints and writes results: the first with a load above 0."""
    worker_loads: tuple[float, ...] = (1.0,)
    """Each rank's share of every mini-batch (MATLAB's WorkerLoad); 0: no computation."""
    device: str = "auto"
    """What the ranks compute on: cpu, gpu, or auto (a GPU when the node has a usable one)."""
    gpus: Optional[tuple[int, ...]] = None
    """The GPU index of each local rank (training.gpus), or null: the local rank's own."""
    global_batch: int = 0
    """Observations per iteration over all workers."""
    worker_batches: tuple[int, ...] = ()
    """Each rank's part of a full global batch."""
    learn_rate: float = 0.0
    """The initial learning rate after lr_scaling."""
    mpi: bool = False
    """Ranks are started by the profile's mpirun and reduce gradients through mpi4py."""
    time_limit_s: int = 3600
    """The wall-clock limit, parsed once from cluster.time."""
    environment: dict[str, str] = field(default_factory=dict)
    """Variables hpcdl sets for every rank (network block, collective timeout, the profile's env)."""
    gather_results: bool = False
    """hpcdl.batch(all_ranks=True): the result is every rank's return value, in rank order."""
    command: tuple[str, ...] = ()
    """entry: the function's path (pkg.mod:function); script: the script's absolute path and its arguments."""
    exported: tuple[str, ...] = ()
    """Names of the variables copied from the submitting shell (their values are never stored)."""

    @property
    def ranks(self) -> RankShares:
        """What the ranks of a training job share out, as resolved here: what they run."""
        return RankShares(self.worker_loads, self.global_batch, self.learn_rate,
                          float(self.cluster.collective_timeout_s))

    @property
    def waited_for_limit_s(self) -> Optional[int]:
        """The shorter hang limit of the built-in trainer, whose collectives fail after collective_timeout_s: a rank
        the others wait for in a collective is hung after HANG_SHARE_OF_COLLECTIVE of that and HANG_MARGIN_S under
        it (at least HANG_FLOOR_S, never above cluster.hang_timeout_s), so that the ranks' stacks are taken before
        the collective's own timeout ends the job with the waiting ranks' errors alone; None for your own code,
        whose collectives have timeouts of their own."""
        limit, collective = self.cluster.hang_timeout_s, self.cluster.collective_timeout_s
        if not limit or self.kind != "train":
            return None
        capped = min(int(HANG_SHARE_OF_COLLECTIVE * collective), collective - HANG_MARGIN_S)
        return min(limit, max(HANG_FLOOR_S, capped))

    @property
    def time_limit_minutes(self) -> int:
        """The time limit in whole minutes, rounded up (sbatch's unit)."""
        return -(-self.time_limit_s // 60)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (tuples become lists)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "JobPlan":
        """The plan a manifest stores, rebuilt without re-validating any section."""
        values = dict(data)
        values["cluster"] = restore(ClusterConfig, values["cluster"])
        values["config"] = restore(Config, values["config"]) if values.get("config") is not None else None
        for name in ("worker_loads", "worker_batches", "exported", "command"):
            values[name] = tuple(values.get(name) or ())
        values["gpus"] = tuple(values["gpus"]) if values.get("gpus") is not None else None
        return cls(**values)


def resolve(config: Config, runs_here: bool = False, script_args: Sequence[str] = ()) -> JobPlan:
    """The plan of a training job (or of the user's entry or script, with ``script_args``); ConfigError
    naming the option for anything that cannot run.

    ``runs_here``: the ranks run on this machine (its backend's ``runs_here``, or a foreground run): the GPUs
    they may use are this machine's, counted only when needed; else the profile's ``gpus_per_node``.
    """
    if config.entry is not None or config.script is not None:
        return resolve_user_code(config, script_args)
    if script_args:
        raise ConfigError(f"arguments after --: only script= takes them ({' '.join(script_args)})")
    training, profile = config.training, config.cluster
    _check_secrets(config, profile)
    available = _gpus_offered(profile, runs_here) if _needs_gpu_count(config) else None
    world, profile = _world(config, available, runs_here)
    ranks = resolve_ranks(training, world, f"execution_environment={training.execution_environment}")
    computing = sum(1 for share in ranks.loads if share > 0)
    if ranks.global_batch < computing:
        raise ConfigError(f"training.mini_batch_size={training.mini_batch_size}: smaller than the {computing} "
                          "computing workers")
    device = _device(config, available, runs_here)
    mpi = training.comm == "mpi" and world > 1
    if training.comm == "mpi":
        from hpcdl.distributed.mpi import check_mpi_available

        check_mpi_available()
    _check_data(config)
    return JobPlan(
        kind="train", name=config.name, cluster=profile, config=config, world_size=world,
        lead_rank=next(rank for rank, share in enumerate(ranks.loads) if share > 0), worker_loads=ranks.loads,
        device=device, gpus=tuple(training.gpus) if training.gpus is not None else None,
        global_batch=ranks.global_batch, worker_batches=tuple(ranks.worker_batches), learn_rate=ranks.learn_rate,
        mpi=mpi,
        time_limit_s=time_limit_seconds(profile.time), environment=job_environment(profile),
        exported=tuple(sorted(exported_environment(profile))))


def resolve_function(profile: ClusterConfig, name: str) -> JobPlan:
    """The plan of a function job (hpcdl.batch): every rank runs the function with the distributed
    variables set (torchrun's on the local profile, Slurm's on Slurm); rank 0's return value is the result."""
    check_job_name(name, "batch: name")
    _check_secrets({"name": name, "cluster": profile}, profile)
    world = profile.nodes * profile.tasks_per_node
    return JobPlan(kind="function", name=name, cluster=profile, world_size=world, worker_loads=(1.0,) * world,
                   time_limit_s=time_limit_seconds(profile.time), environment=job_environment(profile),
                   exported=tuple(sorted(exported_environment(profile))))


TRAINER_ONLY = ("execution_environment", "gpus", "worker_load")
"""Training options that an opaque entry or script cannot honour."""


def resolve_user_code(config: Config, script_args: Sequence[str] = ()) -> JobPlan:
    """The plan of a job that runs the user's entry function or script on every rank, each with torchrun's
    variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT)."""
    from hpcdl.config.targets import check_entry, check_script

    profile = config.cluster
    _check_secrets(config, profile)
    defaults = TrainingOptions()
    for name in TRAINER_ONLY:
        if getattr(config.training, name) != getattr(defaults, name):
            raise ConfigError(f"training.{name}: an option of the built-in trainer; your entry or script picks "
                              "its own device (each rank gets LOCAL_RANK, and the GPUs the profile gives it)")
    if config.entry is not None:
        if script_args:
            raise ConfigError(f"arguments after --: only a script takes them, not entry={config.entry}")
        kind, command = "entry", (check_entry(config.entry),)
    else:
        kind, command = "script", (check_script(config.script), *script_args)
    world = profile.nodes * profile.tasks_per_node
    return JobPlan(kind=kind, name=config.name, cluster=profile, config=config, world_size=world,
                   worker_loads=(1.0,) * world, command=command, time_limit_s=time_limit_seconds(profile.time),
                   environment=job_environment(profile), exported=tuple(sorted(exported_environment(profile))))


def _check_secrets(tree: Any, profile: ClusterConfig) -> None:
    """The profile's secrets are set in this shell, and no option holds a secret's value."""
    check_secrets_set(profile.secrets)
    check_no_secret_values(tree, "", profile.secrets)


def _needs_gpu_count(config: Config) -> bool:
    training = config.training
    return training.execution_environment in ("gpu", "multi-gpu") or training.gpus is not None


def _gpus_offered(profile: ClusterConfig, runs_here: bool) -> int:
    """GPUs a rank can use: this machine's where the ranks run here, else the profile's GPUs per node."""
    if not runs_here:
        return profile.gpus_per_node
    from hpcdl.gpus import gpu_count

    return gpu_count()


def _where(runs_here: bool) -> str:
    return "on this machine" if runs_here else "per node in the profile (cluster.gpus_per_node)"


def _world(config: Config, available: Optional[int], runs_here: bool) -> tuple[int, ClusterConfig]:
    """Ranks in all, and the profile as submitted (multi-gpu asks for one task per GPU)."""
    training, profile = config.training, config.cluster
    env = training.execution_environment
    tasks = profile.nodes * profile.tasks_per_node
    if env in ("auto", "cpu", "gpu"):
        if tasks > 1:
            raise ConfigError(f"training.execution_environment={env} trains in one process, but the profile asks "
                              f"for {tasks} tasks; use parallel (or multi-gpu)")
        return 1, profile
    if env == "multi-gpu":
        if profile.nodes != 1:
            raise ConfigError("training.execution_environment=multi-gpu: one node; use parallel for several")
        gpus = training.gpus if training.gpus is not None else list(range(available or 0))
        if not gpus:
            raise ConfigError(f"training.execution_environment=multi-gpu: no GPU {_where(runs_here)}")
        return len(gpus), dataclasses.replace(profile, tasks_per_node=len(gpus))
    return tasks, profile


def _device(config: Config, available: Optional[int], runs_here: bool) -> str:
    """cpu, gpu or auto; a GPU asked for where none is offered, or an index beyond them, is an error."""
    training = config.training
    env = training.execution_environment
    if env == "cpu":
        return "cpu"
    if available is not None:
        if available == 0:
            raise ConfigError(f"training.execution_environment={env}"
                              + (f" with training.gpus={training.gpus}" if training.gpus is not None else "")
                              + f": no GPU {_where(runs_here)}")
        from hpcdl.gpus import check_gpu_choice

        check_gpu_choice(env, training.gpus, available, _where(runs_here))
    if env in ("gpu", "multi-gpu"):
        return "gpu"
    return "auto"


def _check_data(config: Config) -> None:
    """The images a training job reads: a folder of class folders with images (local or fsspec URL)."""
    data = config.data
    if not data.built_in or data.name == "digits":
        return  # the user's dataset checked its arguments; digits are written on first use
    from hpcdl.data.listing import check_image_root

    check_image_root(data.root, data.labels_csv)
