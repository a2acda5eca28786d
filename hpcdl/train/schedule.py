"""The learning rate at each iteration: piecewise or cosine decay after an optional linear warm-up."""

from __future__ import annotations

import math
from typing import Optional

from hpcdl.config import TrainingOptions


def learn_rate_at(options: TrainingOptions, iteration: int, iterations_per_epoch: int,
                  initial: Optional[float] = None) -> float:
    """The rate for 0-based ``iteration``, from ``initial`` (default: the options' rate); warm-up ramps
    linearly to the scheduled rate."""
    base = options.learn_rate if initial is None else initial
    epoch = iteration // iterations_per_epoch
    if options.learn_rate_schedule == "piecewise":
        rate = base * options.learn_rate_drop_factor ** (epoch // options.learn_rate_drop_period)
    elif options.learn_rate_schedule == "cosine":
        total = options.max_epochs * iterations_per_epoch
        rate = 0.5 * base * (1 + math.cos(math.pi * min(iteration, total) / total))
    else:
        rate = base
    if iteration < options.warmup_iterations:
        rate *= (iteration + 1) / options.warmup_iterations
    return rate
