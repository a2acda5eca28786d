"""Batches for the training loop: in the main process (as MATLAB), or from background workers.

With ``dispatch_in_background`` worker processes read, decode and augment ahead
of the loop into pinned memory, ``prefetch_factor`` batches each, and persist
across epochs. With GPU decoding they only read the files, and the GPU decodes
and augments (hpcdl.data.encoded). Each item is asked for as (index, epoch)
where the datastore accepts it, so augmentation repeats exactly. On a GPU the
copy, layout and dtype conversion (and the decoding) run on a side stream,
``device_prefetch`` batches ahead (hpcdl.data.prefetch). Bad files skipped by a
datastore come back as None and are dropped from their batch and counted.
"""

from __future__ import annotations

from typing import Any, Iterator, Optional, Sequence

import torch
from torch.utils.data import DataLoader, Dataset, Sampler
from torch.utils.data._utils.collate import default_collate

from hpcdl.data.batches import Batch, TensorPair, pinned_to, to_device
from hpcdl.data.encoded import EncodedItems, collate_encoded, decode_on_device
from hpcdl.data.prefetch import prefetched
from hpcdl.host import usable_cpus


def default_workers() -> int:
    """Workers for background dispatch: the CPUs the scheduler gave this task (not the node's), less one for the
    loop."""
    return max(1, usable_cpus() - 1)


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
                 background: bool = False, workers: Optional[int] = None, prefetch: int = 2, seed: int = 0, *,
                 gpu_decode: bool = False, device_prefetch: int = 0,
                 cpu_decode_share: float = 0.0) -> None:
        self.data, self.device, self.memory_format = data, device, memory_format
        self.gpu_decode, self.device_prefetch = gpu_decode, device_prefetch
        self.skipped = 0
        self.sampler = EpochBatches(getattr(data, "accepts_epoch", False))
        self.loader: Optional[DataLoader] = None
        if not isinstance(data, TensorPair):
            count = (workers if workers is not None else default_workers()) if background else 0
            items = EncodedItems(data, cpu_decode_share) if gpu_decode else data
            self.loader = DataLoader(items, batch_sampler=self.sampler,
                                     num_workers=count, collate_fn=collate_encoded if gpu_decode else collate_skipping,
                                     pin_memory=device.type == "cuda", prefetch_factor=prefetch if count else None,
                                     persistent_workers=count > 0, worker_init_fn=_reopen_in_worker if count else None,
                                     # the workers' seeds come from here, not from the generator dropout draws on
                                     generator=torch.Generator().manual_seed(seed))

    def host_batches(self, chunks: Sequence[torch.Tensor], epoch: int) -> Iterator[Any]:
        """The batches of ``chunks`` in order, in host memory (encoded with GPU decoding); None for a batch
        whose every file was skipped. Tensors already on the GPU are gathered there, without a host wait."""
        if self.loader is None:
            x, y = self.data.x, self.data.y
            for index in chunks:
                yield x[pinned_to(index, x.device)], y[pinned_to(index, y.device)]
            return
        self.sampler.set(chunks, epoch)
        for batch in self.loader:
            if self.gpu_decode:
                yield batch
                continue
            x, y, skipped = batch
            self.skipped += skipped
            yield (x, y) if len(y) else None

    def to_device(self, batch: Any) -> Optional[Batch]:
        """A host batch on the device (float32 images in [0, 1]; decoded and augmented there if encoded)."""
        if batch is None:
            return None
        if not self.gpu_decode:
            return to_device(*batch, self.device, self.memory_format)
        ready, skipped = decode_on_device(batch, self.data, self.device, self.memory_format)
        self.skipped += skipped
        return ready

    def close(self) -> None:
        """Stop the background workers now, as Lightning does (persistent workers otherwise live as long as
        anything, such as a traceback, holds the loader)."""
        iterator = getattr(self.loader, "_iterator", None)
        if iterator is not None and hasattr(iterator, "_shutdown_workers"):
            iterator._shutdown_workers()
        self.loader = None

    def epoch(self, chunks: Sequence[torch.Tensor], epoch: int) -> Iterator[Optional[Batch]]:
        """The batches of ``chunks`` in order, on the device; None for a batch whose every file was skipped."""
        batches = self.host_batches(chunks, epoch)
        if self.device_prefetch and self.device.type == "cuda" and self.loader is not None:
            return prefetched(batches, self.to_device, self.device, self.device_prefetch)
        return (self.to_device(batch) for batch in batches)


def iterate_batches(data: Dataset, chunks: Sequence[torch.Tensor], device: torch.device,
                    memory_format: torch.memory_format = torch.contiguous_format) -> Iterator[Batch]:
    """One (x, y) batch per chunk of indices, read in this process, on ``device`` (skipped files left out)."""
    return (batch for batch in BatchLoader(data, device, memory_format).epoch(chunks, 0) if batch is not None)
