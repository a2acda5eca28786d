"""Mini-batches from a dataset or a pair of tensors, in a given order, onto a device."""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch
from torch.utils.data import Dataset

from hpcdl.errors import ConfigError

Batch = tuple[torch.Tensor, torch.Tensor]


class TensorPair(Dataset):
    """Observations ``x[i]`` with responses ``y[i]``, indexed in whole batches without a loader."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, classes: Optional[Sequence[str]] = None) -> None:
        if len(x) != len(y):
            raise ConfigError(f"data: {len(x)} observations but {len(y)} responses")
        self.x, self.y = x, y
        if classes is not None:
            self.classes = list(classes)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> Batch:
        return self.x[index], self.y[index]


def as_dataset(data: Any, what: str = "data") -> Dataset:
    """Accept a Dataset of (x, y) or an (x, y) pair of tensors; reject anything else clearly."""
    if isinstance(data, (tuple, list)) and len(data) == 2 and all(isinstance(t, torch.Tensor) for t in data):
        return TensorPair(*data)
    if isinstance(data, Dataset) and hasattr(data, "__len__"):
        if len(data) == 0:
            raise ConfigError(f"{what}: holds no observations")
        return data
    raise ConfigError(f"{what}: expected a torch Dataset of (input, response) or an (x, y) tensor pair, "
                      f"got {type(data).__name__}")


def classes_of(data: Any) -> Optional[list[str]]:
    """The class names a dataset carries (``.classes``), if any."""
    classes = getattr(data, "classes", None)
    return list(classes) if classes is not None else None


def to_device(x: torch.Tensor, y: torch.Tensor, device: torch.device,
              memory_format: torch.memory_format = torch.contiguous_format) -> Batch:
    """Move a batch to ``device``; uint8 images become float32 in [0, 1] there (a quarter of the copy).

    The copy is of the contiguous batch from pinned memory; the layout (``memory_format``) and dtype
    conversions run on the device, never on the host.
    """
    x, y = pinned_to(x, device), pinned_to(y, device)
    if x.ndim != 4:
        return (x.float().div_(255.0) if x.dtype == torch.uint8 else x), y
    if x.dtype == torch.uint8:
        return x.to(torch.float32, memory_format=memory_format).div_(255.0), y
    return x.contiguous(memory_format=memory_format), y


def pinned_to(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``t`` on ``device``; a CPU tensor bound for a GPU goes from pinned memory, so the host does not wait."""
    if t.device == device or device.type != "cuda" or t.is_cuda:
        return t.to(device)
    return (t if t.is_pinned() else t.contiguous().pin_memory()).to(device, non_blocking=True)
