"""The device a run computes on, chosen from training.execution_environment, with the reason."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hpcdl.config import TrainingOptions
from hpcdl.errors import ConfigError


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
        raise ConfigError(
            f"training.execution_environment={env}: one process per worker is started by the "
            "distributed launcher, which this version of hpcdl does not have yet; use auto, cpu or gpu"
        )
    if env == "cpu":
        return DeviceChoice(torch.device("cpu"), "execution_environment=cpu")
    count = usable_gpu_count()
    if count == 0:
        if env == "gpu":
            raise ConfigError("training.execution_environment=gpu: no usable CUDA GPU on this machine "
                              f"(torch {torch.__version__}, CUDA available: {torch.cuda.is_available()})")
        return DeviceChoice(torch.device("cpu"), "execution_environment=auto and no usable CUDA GPU")
    index = options.gpus[0] if options.gpus else 0
    if options.gpus and max(options.gpus) >= count:
        raise ConfigError(f"training.gpus={options.gpus}: this machine has {count} GPU(s), "
                          f"indices 0..{count - 1}")
    if options.gpus and len(options.gpus) > 1:
        raise ConfigError(f"training.gpus={options.gpus}: several GPUs need "
                          "execution_environment=multi-gpu; gpu and auto use one")
    name = torch.cuda.get_device_name(index)
    return DeviceChoice(torch.device("cuda", index), f"execution_environment={env}: GPU {index} ({name})")
