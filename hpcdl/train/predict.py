"""predict and classify: batched inference on the chosen device."""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch
from torch import nn
from torch.utils.data import Dataset

from hpcdl.config import TrainingOptions
from hpcdl.data.batches import TensorPair, as_dataset, classes_of
from hpcdl.data.loader import iterate_batches
from hpcdl.train.device import choose_device
from hpcdl.train.steps import autocast


def _inputs(data: Any) -> Dataset:
    """A dataset of (x, anything) from a Dataset, an (x, y) pair or a bare tensor of inputs."""
    if isinstance(data, torch.Tensor):
        return TensorPair(data, torch.zeros(len(data), dtype=torch.long))
    return as_dataset(data, "data")


@torch.no_grad()
def predict(model: nn.Module, data: Any, options: Optional[TrainingOptions] = None) -> torch.Tensor:
    """The network's outputs for every observation of ``data``, in order, on the CPU (float32)."""
    options = options if options is not None else TrainingOptions(verbose=False)
    device = choose_device(options).device
    memory_format = torch.channels_last if options.channels_last else torch.contiguous_format
    model = model.to(device, memory_format=memory_format).eval()
    cast = autocast(options, device)
    dataset = _inputs(data)
    outputs = []
    for x, _ in iterate_batches(dataset, torch.arange(len(dataset)).split(options.mini_batch_size), device,
                                memory_format):
        with cast():
            outputs.append(model(x).float())
    return torch.cat(outputs).cpu()


def classify(model: nn.Module, data: Any, options: Optional[TrainingOptions] = None, *,
             classes: Optional[Sequence[str]] = None) -> tuple[list[Any], torch.Tensor]:
    """Predicted labels (class names from ``classes`` or the data, else indices) and softmax scores."""
    scores = predict(model, data, options).softmax(dim=1)
    names = list(classes) if classes is not None else classes_of(data)
    indices = scores.argmax(dim=1).tolist()
    return ([names[i] for i in indices] if names else indices), scores
