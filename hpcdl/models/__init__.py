"""Built-in networks, by name. The registry imports no torch until a network is built."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    import torch

MODELS = {
    "small_cnn": "hpcdl.models.cnn:small_cnn",
    "mlp": "hpcdl.models.cnn:mlp",
    "resnet18": "hpcdl.models.resnet:resnet18",
    "resnet50": "hpcdl.models.resnet:resnet50",
}


def build_model(name: str, *, in_channels: int, num_classes: int, width: Optional[int] = None,
                dropout: float = 0.0, image_size: tuple[int, int] = (32, 32)) -> "torch.nn.Module":
    """Build the network ``name`` for inputs of ``in_channels`` and ``num_classes`` outputs; ``width`` None
    gives the network's standard width (ResNets 64, as torchvision's)."""
    module_name, function = MODELS[name].split(":")
    builder = getattr(importlib.import_module(module_name), function)
    sized = {"width": width} if width is not None else {}
    return builder(in_channels=in_channels, num_classes=num_classes, dropout=dropout, image_size=image_size,
                   **sized)
