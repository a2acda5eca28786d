"""The device a run computes on, chosen from training.execution_environment, with the reason."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hpcdl.config import TrainingOptions
from hpcdl.errors import ConfigError
from hpcdl.gpus import check_gpu_choice, gpu_of


@dataclass(frozen=True)
class DeviceChoice:
    """The chosen device and why it was chosen, as the run reports it."""

    device: torch.device
    reason: str


def usable_gpu_count() -> int:
    """GPUs torch can compute on here (0 when CUDA is missing or broken)."""
    try:
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except RuntimeError:
        return 0


def choose_device(options: TrainingOptions) -> DeviceChoice:
    """Resolve auto / cpu / gpu to one device; a GPU asked for and missing is an error."""
    env = options.execution_environment
    if env in ("multi-gpu", "parallel"):
        return _worker_device(options)
    if env == "cpu":
        return DeviceChoice(torch.device("cpu"), "execution_environment=cpu")
    count = usable_gpu_count()
    if count == 0:
        if env == "gpu":
            raise ConfigError("training.execution_environment=gpu: no usable CUDA GPU on this machine "
                              f"(torch {torch.__version__}, CUDA available: {torch.cuda.is_available()})")
        return DeviceChoice(torch.device("cpu"), "execution_environment=auto and no usable CUDA GPU")
    check_gpu_choice(env, options.gpus, count, "on this machine")
    index = gpu_of(options.gpus, 0)
    name = torch.cuda.get_device_name(index)
    return DeviceChoice(torch.device("cuda", index), f"execution_environment={env}: GPU {index} ({name})")


def _worker_device(options: TrainingOptions) -> DeviceChoice:
    """One worker of a multi-gpu or parallel run: its GPU by local rank, or the CPU where none."""
    from hpcdl.distributed.env import local_env

    env, count = options.execution_environment, usable_gpu_count()
    if count == 0:
        if env == "multi-gpu":
            raise ConfigError("training.execution_environment=multi-gpu: no usable CUDA GPU on this machine")
        return DeviceChoice(torch.device("cpu"), "execution_environment=parallel on a node without GPUs: "
                                                 "a CPU worker (gloo)")
    local = local_env()
    index = gpu_of(options.gpus, local.local_rank)
    if index >= count:
        raise ConfigError(f"training.gpus: local rank {local.local_rank} needs GPU {index}, but this node "
                          f"has {count} (indices 0..{count - 1})")
    torch.cuda.set_device(index)
    return DeviceChoice(torch.device("cuda", index),
                        f"execution_environment={env}: GPU {index} ({torch.cuda.get_device_name(index)})")
