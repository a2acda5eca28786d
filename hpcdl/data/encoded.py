"""JPEG files decoded on the GPU: workers read bytes, nvJPEG decodes a whole batch, the GPU augments it.

A worker ships each JPEG file's bytes (one buffer per batch, with offsets) and the
image's augmentation draws. Other formats, JPEG files cut short, and a set share
of the JPEG files (``cpu_share``, as DALI splits a batch between its decoders)
are decoded and augmented in the worker as on the CPU path, so one odd file
costs the rest of its batch nothing and idle CPUs take load off the GPU's
decoder. On the GPU the rest of a batch is decoded by one call of
``torchvision.io.decode_jpeg`` (the hardware JPEG engines where the GPU has
them), then cropped, flipped and augmented as one batch by
``AugmentedImageDatastore.augment`` with the same draws as the CPU path. A file
nvJPEG refuses is decoded on the CPU; one neither can read raises BadImageError
naming it (or is skipped with on_bad_file=skip).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from hpcdl.data.augment import AugmentedImageDatastore
from hpcdl.data.batches import Batch, pinned_to
from hpcdl.data.images import ImageDatastore, as_chw
from hpcdl.errors import ConfigError

JPEG_SUFFIXES = (".jpg", ".jpeg")


def is_whole_jpeg(data: bytes) -> bool:
    """A JPEG stream from its start-of-image marker to an end-of-image marker (a little padding allowed)."""
    return data[:3] == b"\xff\xd8\xff" and b"\xff\xd9" in data[-64:]


def use_gpu_decode(option: str, data: Dataset, device: torch.device) -> bool:
    """Resolve training.gpu_decode (auto, on, off) for ``data`` trained on ``device``."""
    if option == "off":
        return False
    suitable = isinstance(data, AugmentedImageDatastore) and isinstance(data.store, ImageDatastore)
    if option == "on":
        if device.type != "cuda" or not suitable:
            raise ConfigError("training.gpu_decode=on: needs a CUDA device and an augmented image datastore "
                              f"(data.augmentation.output_size); got {device} and {type(data).__name__}")
        return True
    if device.type != "cuda" or not suitable:
        return False
    paths = data.store.paths
    return sum(p.lower().endswith(JPEG_SUFFIXES) for p in paths) >= len(paths) / 2


@dataclasses.dataclass
class EncodedBatch:
    """A batch as workers ship it: JPEG bytes end to end, and the images they decoded themselves."""

    data: torch.Tensor
    """uint8: every JPEG file of the batch, end to end."""
    offsets: list[int]
    """Image i's file is data[offsets[i]:offsets[i + 1]] (empty for an image in ``done``)."""
    done: torch.Tensor
    """uint8 N x C x h x w: the images the workers decoded and augmented themselves, in batch order."""
    done_at: list[int]
    """Their positions in the batch (their files are empty in ``data``)."""
    indices: list[int]
    """Each image's index in the datastore."""
    labels: torch.Tensor
    draws: torch.Tensor
    """float64 B x DRAWS augmentation draws."""
    skipped: int
    """Unreadable files left out by the workers."""

    def pin_memory(self) -> "EncodedBatch":
        """Pin what is copied to the GPU as it is (nvJPEG stages the file bytes itself)."""
        return dataclasses.replace(self, done=self.done.pin_memory(), labels=self.labels.pin_memory(),
                                   draws=self.draws.pin_memory())


def decoded_on_cpu(index: int, epoch: int, share: float) -> bool:
    """Whether the workers decode image ``index`` in ``epoch`` themselves: a fixed, evenly spread ``share``."""
    return ((index * 0x9E3779B1 + epoch * 0x85EBCA77) & 0xFFFFFFFF) < share * 2**32


class EncodedItems(Dataset):
    """The worker's side: (index, label, draws, JPEG bytes or an image it augmented) of an augmented datastore."""

    accepts_epoch = True

    def __init__(self, augmented: AugmentedImageDatastore, cpu_share: float = 0.0) -> None:
        self.augmented, self.store, self.cpu_share = augmented, augmented.store, cpu_share

    def __len__(self) -> int:
        return len(self.store)

    def reopen(self) -> None:
        """Reopen the datastore's files in a new worker process."""
        self.augmented.reopen()

    def __getitem__(self, key: Any) -> Optional[tuple[int, int, torch.Tensor, bytes, Optional[torch.Tensor]]]:
        index, epoch = key if isinstance(key, tuple) else (key, 0)
        data = self.store.read_bytes(index)
        if data is None:
            return None
        draws, label = self.augmented.draws(index, epoch), int(self.store.labels[index])
        if is_whole_jpeg(data) and not decoded_on_cpu(index, epoch, self.cpu_share):
            return index, label, draws, data, None
        array = self.store.decode(index, data, self.augmented.draft)
        if array is None:
            return None
        return index, label, draws, b"", self.augmented.augment([as_chw(array)], draws[None])[0]


def collate_encoded(items: list[Any]) -> EncodedBatch:
    """One buffer of JPEG bytes for the batch (one shared-memory transfer, not one per file)."""
    kept = [item for item in items if item is not None]
    files = [item[3] for item in kept]
    offsets = np.cumsum([0] + [len(f) for f in files]).tolist()
    joined = b"".join(files)
    data = torch.frombuffer(bytearray(joined), dtype=torch.uint8) if joined else torch.empty(0, dtype=torch.uint8)
    done_at = [i for i, item in enumerate(kept) if item[4] is not None]
    done = torch.stack([kept[i][4] for i in done_at]) if done_at else torch.zeros(0, dtype=torch.uint8)
    return EncodedBatch(data=data, offsets=offsets, done_at=done_at, done=done,
                        indices=[item[0] for item in kept],
                        labels=torch.tensor([item[1] for item in kept], dtype=torch.long),
                        draws=torch.stack([item[2] for item in kept]) if kept else torch.zeros(0, 1),
                        skipped=len(items) - len(kept))


def nvjpeg(files: Sequence[torch.Tensor], channels: int, device: torch.device) -> list[torch.Tensor]:
    """Decode JPEG files (uint8 CPU tensors) on ``device`` in one batched nvJPEG call."""
    from torchvision.io import ImageReadMode, decode_jpeg

    mode = ImageReadMode.RGB if channels == 3 else ImageReadMode.GRAY
    return decode_jpeg(list(files), mode=mode, device=device)


def decode_on_device(batch: EncodedBatch, augmented: AugmentedImageDatastore, device: torch.device,
                     memory_format: torch.memory_format) -> tuple[Optional[Batch], int]:
    """The augmented float32 batch in [0, 1] on ``device`` in ``memory_format``, and how many files were
    left out (None when none is left)."""
    store: ImageDatastore = augmented.store
    count = len(batch.indices)
    done = set(batch.done_at)
    jpeg = [i for i in range(count) if i not in done]
    files = [batch.data[batch.offsets[i]:batch.offsets[i + 1]] for i in jpeg]
    try:
        decoded = nvjpeg(files, store.channels, device) if files else []
    except RuntimeError:  # one file nvJPEG refuses fails the batch: find it, decode it on the CPU
        decoded = [_one_by_one(store, batch.indices[i], f, device) for i, f in zip(jpeg, files)]
    images = {i: _at_image_size(image, store.image_size) for i, image in zip(jpeg, decoded) if image is not None}
    here = sorted(images)
    skipped = batch.skipped + len(jpeg) - len(here)
    if not here and not batch.done_at:
        return None, skipped
    parts = [augmented.augment([images[i] for i in here], batch.draws[here])] if here else []
    if batch.done_at:
        parts.append(batch.done.to(device, non_blocking=True))
    x = torch.cat(parts) if len(parts) > 1 else parts[0]
    keep = here + batch.done_at
    if len(parts) > 1 or len(keep) < count:  # back into batch order, without the skipped files
        order = sorted(range(len(keep)), key=keep.__getitem__)
        x = x[pinned_to(torch.tensor(order), device)]
        keep = sorted(keep)
    y = (batch.labels if len(keep) == count else batch.labels[keep]).to(device, non_blocking=True)
    return (x.to(torch.float32, memory_format=memory_format).div_(255.0), y), skipped


def _one_by_one(store: ImageDatastore, index: int, file: torch.Tensor, device: torch.device) -> Optional[torch.Tensor]:
    try:
        return nvjpeg([file], store.channels, device)[0]
    except RuntimeError:
        array = store.decode(index, file.numpy().tobytes())  # BadImageError names the file
        return None if array is None else as_chw(array).to(device)


def _at_image_size(image: torch.Tensor, size: Optional[Sequence[int]]) -> torch.Tensor:
    """The image resized to the datastore's image_size, where one is set (as the CPU reader does)."""
    if not size or tuple(image.shape[-2:]) == tuple(size):
        return image
    return F.interpolate(image[None].float(), size=tuple(size), mode="bilinear", antialias=True,
                         align_corners=False)[0].round_().clamp_(0, 255).to(torch.uint8)
