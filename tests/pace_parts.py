"""A user's network that is slow on one rank: a busy loop in its forward, as a CPU-throttled node's rank is."""

from __future__ import annotations

from pathlib import Path

SOURCE = '''
import time

import torch
from torch import nn

from hpcdl.distributed.env import global_rank


class SlowNet(nn.Module):
    """A small classifier whose forward spins ``busy_s`` seconds on rank ``slow_rank`` (none when -1)."""

    def __init__(self, in_channels: int, num_classes: int, image_size: list, slow_rank: int = -1,
                 busy_s: float = 0.0) -> None:
        super().__init__()
        self.busy_s = busy_s if global_rank() == slow_rank else 0.0
        inputs = in_channels * image_size[0] * image_size[1]
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(inputs, 16), nn.ReLU(), nn.Linear(16, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        end = time.perf_counter() + self.busy_s
        while time.perf_counter() < end:
            pass
        return self.body(x)
'''


def write_slow_net(folder: Path) -> Path:
    """``folder`` with slownet.py in it (SlowNet)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "slownet.py").write_text(SOURCE)
    return folder
