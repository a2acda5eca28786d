"""Built-in networks, by name. The registry imports no torch until a network is built."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

MODELS = {
    "small_cnn": "hpcdl.models.cnn:small_cnn",
    "mlp": "hpcdl.models.cnn:mlp",
    "resnet18": "hpcdl.models.resnet:resnet18",
    "resnet50": "hpcdl.models.resnet:resnet50",
}


def build_model(name: str, *, in_channels: int, num_classes: int, width: int = 16,
                dropout: float = 0.0, image_size: tuple[int, int] = (32, 32)) -> "torch.nn.Module":
    """Build the network ``name`` for inputs of ``in_channels`` and ``num_classes`` outputs."""
    module_name, function = MODELS[name].split(":")
    builder = getattr(importlib.import_module(module_name), function)
    return builder(in_channels=in_channels, num_classes=num_classes, width=width,
                   dropout=dropout, image_size=image_size)
