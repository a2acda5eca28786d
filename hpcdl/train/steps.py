"""The pieces of one iteration: optimizer, loss, autocast, a training step, an evaluation pass."""

from __future__ import annotations

import contextlib
from typing import Callable, ContextManager, Optional

import torch
from torch import nn
from torch.utils.data import Dataset

from hpcdl.config.targets import build_part
from hpcdl.config.training import DEFAULT_SQUARED_GRADIENT_DECAY, TrainingOptions
from hpcdl.data.loader import iterate_batches

AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def make_optimizer(model: nn.Module, options: TrainingOptions, lr: float, fused: bool = False) -> torch.optim.Optimizer:
    """The solver with MATLAB's defaults at learning rate ``lr``; L2 regularization is added to the gradients.
    ``fused``: one kernel for the whole update (sgdm and adam on a GPU; rmsprop has none)."""
    params, wd = model.parameters(), options.l2_regularization
    kernel = {"fused": True} if fused else {}
    beta2 = options.squared_gradient_decay_factor
    if beta2 is None:
        beta2 = DEFAULT_SQUARED_GRADIENT_DECAY[options.solver]
    if options.solver == "sgdm":
        return torch.optim.SGD(params, lr=lr, momentum=options.momentum, weight_decay=wd, **kernel)
    if options.solver == "adam":
        return torch.optim.Adam(params, lr=lr, betas=(options.gradient_decay_factor, beta2),
                                eps=options.epsilon, weight_decay=wd, **kernel)
    return torch.optim.RMSprop(params, lr=lr, alpha=beta2, eps=options.epsilon, weight_decay=wd)


def make_loss(options: TrainingOptions) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """Cross-entropy on class indices, mean squared error on responses, or the user's own loss (a class built
    with training.loss_args, or a function given them as keywords)."""
    if options.own_loss:
        return build_part(options.loss, options.loss_args, "training.loss")
    if options.loss == "crossentropy":
        return nn.functional.cross_entropy
    return lambda out, y: nn.functional.mse_loss(out, y.to(out.dtype))


def reports_accuracy(options: TrainingOptions, out: torch.Tensor, y: torch.Tensor) -> bool:
    """Whether a batch's accuracy is counted: cross-entropy, or the user's loss on class indices."""
    if options.own_loss:
        return out.dim() == 2 and not y.is_floating_point() and y.dim() == 1
    return options.loss == "crossentropy"


def autocast(options: TrainingOptions, device: torch.device) -> Callable[[], ContextManager]:
    """A factory of the mixed-precision context for ``options.precision`` (float32 or unset: none)."""
    if options.precision in (None, "float32"):
        return contextlib.nullcontext
    dtype = AUTOCAST_DTYPES[options.precision]
    return lambda: torch.autocast(device.type, dtype=dtype)


def clip_gradients(model: nn.Module, options: TrainingOptions) -> None:
    """Rescale by global L2 norm, or clamp each entry, at gradient_threshold."""
    if options.gradient_clip == "norm":
        nn.utils.clip_grad_norm_(model.parameters(), options.gradient_threshold)
    elif options.gradient_clip == "value":
        nn.utils.clip_grad_value_(model.parameters(), options.gradient_threshold)


def correct_count(out: torch.Tensor, y: torch.Tensor, classification: bool) -> Optional[torch.Tensor]:
    """How many predictions in the batch hit their label (None for regression)."""
    return (out.argmax(1) == y).sum() if classification else None


@torch.no_grad()
def evaluate_totals(model: nn.Module, data: Dataset, indices: torch.Tensor, options: TrainingOptions,
                    device: torch.device, memory_format: torch.memory_format) -> torch.Tensor:
    """[loss sum, correct, count] of ``model`` over ``data[indices]``, in eval mode, without a sync."""
    was_training = model.training
    model.eval()
    loss_fn, cast = make_loss(options), autocast(options, device)
    totals = torch.zeros(4, device=device, dtype=torch.float64)
    for x, y in iterate_batches(data, indices.split(options.mini_batch_size), device, memory_format):
        with cast():
            out = model(x)
            totals[0] += loss_fn(out.float(), y).double() * len(y)
        if reports_accuracy(options, out, y):
            totals[1] += correct_count(out, y, True)
            totals[3] += len(y)
        totals[2] += len(y)
    model.train(was_training)
    return totals


def validation_record(totals: torch.Tensor, options: TrainingOptions) -> dict[str, Optional[float]]:
    """Mean loss, and accuracy over the observations it was counted for, from summed totals (one sync)."""
    loss_sum, correct, count, classified = totals.tolist()
    return {"loss": loss_sum / count, "accuracy": correct / classified if classified else None}
