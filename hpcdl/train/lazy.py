"""Lazy layers (torch.nn.LazyLinear, LazyConv2d, ...): their parameters take their shapes from a first input."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.parameter import is_lazy
from torch.utils.data import Dataset

from hpcdl.data.loader import iterate_batches

DRY_RUN_SAMPLES = 2


@torch.no_grad()
def materialize_lazy_modules(model: nn.Module, data: Dataset) -> None:
    """Give lazy layers their shapes with one forward pass, in eval mode on this process's CPU, of the first
    samples of ``data`` as the training steps read them; before the network moves to its device and memory
    format, before the optimizer and DDP see its parameters. Nothing happens to a network without lazy layers."""
    if not any(is_lazy(t) for t in (*model.parameters(), *model.buffers())):
        return
    was_training = model.training
    model.eval()  # a batch of 2 through BatchNorm; no running statistics change
    try:
        for x, _ in iterate_batches(data, [torch.arange(min(DRY_RUN_SAMPLES, len(data)))], torch.device("cpu")):
            model(x)
            break
    finally:
        model.train(was_training)
