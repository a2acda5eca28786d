"""The GPUs this process can see (MATLAB's gpuDeviceTable and gpuDeviceCount), counted from 0 as training.gpus is.

Read from NVML (nvidia-ml-py) without initialising CUDA; torch is the fallback where NVML is missing.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Optional, Sequence

from hpcdl.errors import ConfigError

GIB = 1024**3


@dataclass(frozen=True)
class GpuInfo:
    """One row of the GPU table."""

    index: int
    name: str
    total_memory_gib: float
    free_memory_gib: Optional[float]
    compute_capability: str
    utilization_pct: Optional[int]


def _from_nvml() -> Optional[list[GpuInfo]]:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no library, no driver: NVML cannot answer
        return None
    try:
        rows = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
            try:
                utilization: Optional[int] = pynvml.nvmlDeviceGetUtilizationRates(handle).gpu
            except pynvml.NVMLError:
                utilization = None
            name = pynvml.nvmlDeviceGetName(handle)
            rows.append(GpuInfo(index, name.decode() if isinstance(name, bytes) else name,
                                round(memory.total / GIB, 1), round(memory.free / GIB, 1),
                                f"{major}.{minor}", utilization))
        return _visible(rows)
    finally:
        pynvml.nvmlShutdown()


def _visible(rows: list[GpuInfo]) -> list[GpuInfo]:
    """Honour CUDA_VISIBLE_DEVICES (integer form) and renumber from 0 as CUDA does."""
    mask = os.environ.get("CUDA_VISIBLE_DEVICES")
    if mask is None:
        return rows
    try:
        chosen = [int(part) for part in mask.split(",") if part.strip()]
    except ValueError:
        return rows  # UUID masks: NVML indices cannot be matched; show every GPU
    by_index = {row.index: row for row in rows}
    return [GpuInfo(**{**asdict(by_index[i]), "index": n}) for n, i in enumerate(chosen) if i in by_index]


def _from_torch() -> list[GpuInfo]:
    import torch

    if not torch.cuda.is_available():
        return []
    rows = []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        free, total = torch.cuda.mem_get_info(index)
        rows.append(GpuInfo(index, props.name, round(total / GIB, 1), round(free / GIB, 1),
                            f"{props.major}.{props.minor}", None))
    return rows


def gpu_table() -> list[GpuInfo]:
    """Every GPU this process can see, NVML first, torch otherwise."""
    rows = _from_nvml()
    return rows if rows is not None else _from_torch()


def gpu_count() -> int:
    """How many GPUs this process can see (MATLAB's gpuDeviceCount)."""
    return len(gpu_table())


def cpu_count() -> int:
    """CPUs this process may run on (its affinity, which Slurm sets), not the node's total."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def gpu_of(gpus: Optional[Sequence[int]], local_rank: int) -> int:
    """The GPU index a rank uses: training.gpus[its local rank], else its local rank."""
    return gpus[local_rank] if gpus else local_rank


def check_gpu_choice(environment: str, gpus: Optional[Sequence[int]], count: int, where: str) -> None:
    """ConfigError for training.gpus naming a GPU beyond the ``count`` offered (``where``: this machine, a
    profile's nodes), or several of them for one process (execution_environment gpu or auto)."""
    if gpus is None:
        return
    if max(gpus) >= count:
        raise ConfigError(f"training.gpus={list(gpus)}: only {count} GPU(s) (indices 0..{count - 1}) {where}")
    if len(gpus) > 1 and environment in ("auto", "gpu"):
        raise ConfigError(f"training.gpus={list(gpus)}: several GPUs need execution_environment=multi-gpu; gpu and "
                          "auto use one")
