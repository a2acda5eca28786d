"""Splitting each global mini-batch across workers by their load (MATLAB's WorkerLoad)."""

from __future__ import annotations

from typing import Optional, Sequence

from hpcdl.errors import ConfigError


def worker_loads(world_size: int, load: Optional[Sequence[float]]) -> list[float]:
    """The load of every rank: equal shares by default; ConfigError if the list does not fit the ranks."""
    if load is None:
        return [1.0] * world_size
    if len(load) != world_size:
        raise ConfigError(f"training.worker_load: {len(load)} entries for {world_size} workers; give one each")
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
