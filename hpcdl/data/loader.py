"""Batches for the training loop: in the main process (as MATLAB), or from background workers.

With ``dispatch_in_background`` worker processes read, decode and augment ahead
of the loop into pinned memory, ``prefetch_factor`` batches each, and persist
across epochs. Each item is asked for as (index, epoch) where the datastore
accepts it, so augmentation repeats exactly. Bad files skipped by a datastore
come back as None and are dropped from their batch and counted.
"""

from __future__ import annotations

import os
from typing import Any, Iterator, Optional, Sequence

import torch
from torch.utils.data import DataLoader, Dataset, Sampler
from torch.utils.data._utils.collate import default_collate

from hpcdl.data.batches import Batch, TensorPair, to_device


def default_workers() -> int:
    """Workers for background dispatch: the CPUs Slurm gave this task (not the node's), less one for the loop."""
    cpus = os.environ.get("SLURM_CPUS_PER_TASK")
    count = int(cpus) if cpus else len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 2
    return max(1, count - 1)


def _reopen_in_worker(_worker: int) -> None:
    """In each background worker: give the datastore its own filesystem handle (object stores)."""
    dataset = torch.utils.data.get_worker_info().dataset
    if hasattr(dataset, "reopen"):
        dataset.reopen()


def collate_skipping(items: list[Any]) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Stack the readable items of a batch; the third value counts the skipped ones."""
    kept = [item for item in items if item is not None]
    if not kept:
        return torch.zeros(0), torch.zeros(0, dtype=torch.long), len(items)
    x, y = default_collate(kept)
    return x, y, len(items) - len(kept)


class EpochBatches(Sampler):
    """The index chunks of the current epoch, as (index, epoch) keys when the datastore takes them."""

    def __init__(self, with_epoch: bool) -> None:
        self.chunks: list[list[Any]] = []
        self.with_epoch = with_epoch

    def set(self, chunks: Sequence[torch.Tensor], epoch: int) -> None:
        self.chunks = [[(i, epoch) for i in c.tolist()] if self.with_epoch else c.tolist() for c in chunks]

    def __iter__(self) -> Iterator[list[Any]]:
        return iter(self.chunks)

    def __len__(self) -> int:
        return len(self.chunks)


class BatchLoader:
    """One loader for a whole run: ``epoch(chunks, epoch)`` yields the batches of those index chunks."""

    def __init__(self, data: Dataset, device: torch.device, memory_format: torch.memory_format,
                 background: bool = False, workers: Optional[int] = None, prefetch: int = 2, seed: int = 0) -> None:
        self.data, self.device, self.memory_format = data, device, memory_format
        self.skipped = 0
        self.sampler = EpochBatches(getattr(data, "accepts_epoch", False))
        self.loader: Optional[DataLoader] = None
        if not isinstance(data, TensorPair):
            count = (workers if workers is not None else default_workers()) if background else 0
            self.loader = DataLoader(data, batch_sampler=self.sampler, num_workers=count,
                                     collate_fn=collate_skipping, pin_memory=device.type == "cuda",
                                     prefetch_factor=prefetch if count else None, persistent_workers=count > 0,
                                     worker_init_fn=_reopen_in_worker if count else None,
                                     # the workers' seeds come from here, not from the generator dropout draws on
                                     generator=torch.Generator().manual_seed(seed))

    def host_batches(self, chunks: Sequence[torch.Tensor], epoch: int) -> Iterator[Optional[Batch]]:
        """The batches of ``chunks`` in order, in host memory; None for a batch whose every file was skipped."""
        if self.loader is None:
            for index in chunks:
                yield self.data.x[index], self.data.y[index]
            return
        self.sampler.set(chunks, epoch)
        for x, y, skipped in self.loader:
            self.skipped += skipped
            yield (x, y) if len(y) else None

    def to_device(self, batch: Optional[Batch]) -> Optional[Batch]:
        """A host batch on the device (float32 images in [0, 1])."""
        return None if batch is None else to_device(*batch, self.device, self.memory_format)

    def close(self) -> None:
        """Stop the background workers now, as Lightning does (persistent workers otherwise live as long as
        anything, such as a traceback, holds the loader)."""
        iterator = getattr(self.loader, "_iterator", None)
        if iterator is not None and hasattr(iterator, "_shutdown_workers"):
            iterator._shutdown_workers()
        self.loader = None

    def epoch(self, chunks: Sequence[torch.Tensor], epoch: int) -> Iterator[Optional[Batch]]:
        """The batches of ``chunks`` in order, on the device; None for a batch whose every file was skipped."""
        return (self.to_device(batch) for batch in self.host_batches(chunks, epoch))
