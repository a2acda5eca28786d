"""A user's own network and dataset, written as a file outside the repository (the tests' user code)."""

from __future__ import annotations

from pathlib import Path

SOURCE = '''
import torch
from torch import nn
from torch.utils.data import TensorDataset


class MyNet(nn.Module):
    """A network hpcdl does not know: it takes what hpcdl supplies and an argument of its own."""

    def __init__(self, in_channels: int, num_classes: int, image_size: list, hidden: int = 8) -> None:
        super().__init__()
        self.hidden = hidden
        inputs = in_channels * image_size[0] * image_size[1]
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(inputs, hidden), nn.ReLU(), nn.Linear(hidden, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


class LazyNet(nn.Module):
    """A network whose layers take their input sizes from the first batch (lazy modules)."""

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.LazyConv2d(4, 3, padding=1), nn.LazyBatchNorm2d(), nn.ReLU(), nn.Flatten(),
                                  nn.LazyLinear(num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def make_blobs(n: int, seed: int = 0) -> TensorDataset:
    """Three classes of 1x4x4 inputs around different means."""
    generator = torch.Generator().manual_seed(seed)
    labels = torch.arange(n) % 3
    inputs = torch.randn(n, 1, 4, 4, generator=generator) * 0.3 + labels.view(-1, 1, 1, 1).float()
    data = TensorDataset(inputs, labels)
    data.classes = ["a", "b", "c"]
    return data


def logged(image: torch.Tensor, log: str) -> torch.Tensor:
    """A transform that notes each call in ``log`` and inverts the image."""
    with open(log, "a") as f:
        f.write("1\\n")
    return 255 - image
'''


def write_user_code(folder: Path) -> Path:
    """``folder`` with mynets.py in it (MyNet, LazyNet, make_blobs, logged)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "mynets.py").write_text(SOURCE)
    return folder
