"""The rules a training run's ranks share by, each written once: every rank's load (MATLAB's WorkerLoad), the
global mini-batch and its split, the learning rate scaled to it. ``resolve_ranks`` applies them: plan.resolve
for a job (its ranks read the result from the plan), train_network for the ranks it finds when called directly.

Torch-free: the plan resolves through this module on the login node.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

from hpcdl.config import TrainingOptions
from hpcdl.errors import ConfigError


@dataclass(frozen=True)
class RankShares:
    """What the ranks of a training run share out, as resolved once: each rank reads it, none derives it."""

    loads: tuple[float, ...]
    """Each rank's share of every mini-batch (training.worker_load); 0: no computation."""
    global_batch: int
    """Observations per iteration over all computing workers."""
    learn_rate: float
    """The initial learning rate after lr_scaling."""
    collective_timeout_s: Optional[float] = None
    """A collective that waits longer fails the run; None: $HPCDL_COLLECTIVE_TIMEOUT_S or the default."""

    @property
    def worker_batches(self) -> list[int]:
        """Each rank's part of a full global batch."""
        return shares(self.global_batch, self.loads)


def resolve_ranks(options: TrainingOptions, world_size: int, where: str = "") -> RankShares:
    """The shares of ``world_size`` ranks training with ``options``; ConfigError for a load list that does not
    fit them (``where``: what made their number)."""
    loads = worker_loads(world_size, options.worker_load, where)
    batch = global_batch(options.mini_batch_size, loads, options.batch_scaling)
    return RankShares(tuple(loads), batch, scaled_learn_rate(options, batch))


def worker_loads(world_size: int, load: Optional[Sequence[float]], where: str = "") -> list[float]:
    """The load of every rank: equal shares by default; ConfigError if the list does not fit the ranks
    (``where``: what made their number, said in the error)."""
    if load is None:
        return [1.0] * world_size
    if len(load) != world_size:
        raise ConfigError(f"training.worker_load: {len(load)} entries for {world_size} workers"
                          f"{f' ({where})' if where else ''}; give one share per worker")
    return [float(x) for x in load]


def shares(batch: int, loads: Sequence[float]) -> list[int]:
    """Split ``batch`` samples in proportion to ``loads`` (largest remainder, every computing worker >= 1)."""
    computing = [i for i, x in enumerate(loads) if x > 0]
    if batch < len(computing):
        return [0] * len(loads)  # too few samples for every computing worker: the batch is skipped
    total = sum(loads)
    exact = [batch * x / total for x in loads]
    counts = [int(e) for e in exact]
    for i in computing:
        counts[i] = max(counts[i], 1)
    order = sorted(computing, key=lambda i: exact[i] - int(exact[i]), reverse=True)
    while sum(counts) < batch:
        counts[order[0]] += 1
        order = order[1:] + order[:1]
    while sum(counts) > batch:
        largest = max(computing, key=lambda i: counts[i] - exact[i])
        counts[largest] -= 1
    return counts


def global_batch(mini_batch_size: int, loads: Sequence[float], batch_scaling: str) -> int:
    """The global mini-batch: as given, or per worker times the computing workers."""
    computing = sum(1 for x in loads if x > 0)
    return mini_batch_size * computing if batch_scaling == "per_worker" else mini_batch_size


def scaled_learn_rate(options: TrainingOptions, global_batch: int) -> float:
    """The initial rate after lr_scaling: linear or sqrt in global_batch / lr_reference_batch (Goyal et al.)."""
    reference = options.lr_reference_batch or options.mini_batch_size
    ratio = global_batch / reference
    factor = {"none": 1.0, "linear": ratio, "sqrt": math.sqrt(ratio)}[options.lr_scaling]
    return options.learn_rate * factor
