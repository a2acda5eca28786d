"""How many workers a training config needs and what it asks the cluster for; checked before submission."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from hpcdl.config.cluster import ClusterConfig
from hpcdl.config import Config
from hpcdl.errors import ConfigError


@dataclass(frozen=True)
class WorkerPlan:
    """The profile as submitted (one task per GPU for multi-gpu), the number of ranks, and how they talk."""

    profile: ClusterConfig
    world_size: int
    mpi: bool


def plan_workers(config: Config) -> WorkerPlan:
    """Resolve the execution environment against the profile; ConfigError for what cannot run."""
    training, profile = config.training, config.cluster
    env = training.execution_environment
    if env in ("auto", "cpu", "gpu"):
        if profile.nodes * profile.tasks_per_node > 1:
            raise ConfigError(f"training.execution_environment={env} trains in one process, but the profile asks "
                              f"for {profile.nodes * profile.tasks_per_node} tasks; use parallel (or multi-gpu)")
        world = 1
    elif env == "multi-gpu":
        if profile.nodes != 1:
            raise ConfigError("training.execution_environment=multi-gpu: one node; use parallel for several")
        available = _gpus_available(profile)
        if available == 0:
            raise ConfigError("training.execution_environment=multi-gpu: no GPU "
                              + ("on this machine" if profile.backend == "local" else
                                 "asked for; set cluster.gpus_per_node"))
        gpus = training.gpus if training.gpus is not None else list(range(available))
        if max(gpus) >= available:
            raise ConfigError(f"training.gpus={gpus}: only {available} GPU(s) (indices 0..{available - 1}) "
                              + ("on this machine" if profile.backend == "local" else "per node in the profile"))
        world = len(gpus)
        profile = dataclasses.replace(profile, tasks_per_node=world)
    else:
        world = profile.nodes * profile.tasks_per_node
    if training.worker_load is not None and len(training.worker_load) != world:
        raise ConfigError(f"training.worker_load: {len(training.worker_load)} entries for {world} workers "
                          f"(execution_environment={env}); give one share per worker")
    computing = world if training.worker_load is None else sum(1 for x in training.worker_load if x > 0)
    if training.batch_scaling == "global" and training.mini_batch_size < computing:
        raise ConfigError(f"training.mini_batch_size={training.mini_batch_size}: smaller than the {computing} "
                          "computing workers")
    return WorkerPlan(profile, world, mpi=training.comm == "mpi" and world > 1)


def _gpus_available(profile: ClusterConfig) -> int:
    if profile.backend == "local":
        from hpcdl.devices import gpu_count

        return gpu_count()
    return profile.gpus_per_node
