"""A lazy image datastore over class folders: only paths are held; images are read per batch."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

from hpcdl.errors import ConfigError

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff")
MODES = {1: "L", 3: "RGB"}


class ImageDatastore(Dataset):
    """Images under ``root/<label>/``; each item is (float32 CxHxW tensor in [0, 1], label index)."""

    def __init__(self, root: str | os.PathLike, *, image_size: Optional[Sequence[int]] = None,
                 channels: Optional[int] = None) -> None:
        root = Path(root)
        if not root.is_dir():
            raise ConfigError(f"image datastore: {root} is not a folder")
        self.classes = sorted(d.name for d in root.iterdir() if d.is_dir())
        if not self.classes:
            raise ConfigError(f"image datastore: {root} holds no class folders")
        paths, labels = [], []
        for label, name in enumerate(self.classes):
            files = sorted(p for p in (root / name).iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
            if not files:
                raise ConfigError(f"image datastore: class folder {root / name} holds no images "
                                  f"({', '.join(IMAGE_SUFFIXES)})")
            paths += files
            labels += [label] * len(files)
        self.root = root
        self.paths: list[Path] = paths
        self.labels = np.asarray(labels, dtype=np.int64)
        self.image_size = tuple(image_size) if image_size else None
        self.channels = channels if channels is not None else self._channels_of(paths[0])
        if self.channels not in MODES:
            raise ConfigError(f"image datastore: channels must be 1 or 3, got {self.channels}")

    @staticmethod
    def _channels_of(path: Path) -> int:
        with Image.open(path) as image:
            return 1 if image.mode in ("1", "L", "I", "I;16", "F") else 3

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path = self.paths[index]
        try:
            with Image.open(path) as image:
                image = image.convert(MODES[self.channels])
                if self.image_size and image.size != (self.image_size[1], self.image_size[0]):
                    image = image.resize((self.image_size[1], self.image_size[0]), Image.BILINEAR)
                array = np.asarray(image, dtype=np.float32) / 255.0
        except OSError as e:
            raise OSError(f"cannot read image {path}: {e}") from e
        tensor = torch.from_numpy(array)
        tensor = tensor.unsqueeze(0) if tensor.ndim == 2 else tensor.permute(2, 0, 1).contiguous()
        return tensor, int(self.labels[index])

    def count_per_label(self) -> dict[str, int]:
        """Number of images of each label."""
        counts = Counter(self.labels.tolist())
        return {name: counts.get(i, 0) for i, name in enumerate(self.classes)}

    def subset(self, indices: Sequence[int]) -> "ImageDatastore":
        """A datastore of the images at ``indices`` (same classes, same reading)."""
        part = object.__new__(ImageDatastore)
        part.__dict__.update(self.__dict__)
        part.paths = [self.paths[i] for i in indices]
        part.labels = self.labels[np.asarray(indices, dtype=np.int64)]
        return part

    def split(self, fraction: float, *, seed: int = 0) -> tuple["ImageDatastore", "ImageDatastore"]:
        """Split each label's images into (1 - fraction, fraction) parts, repeatably from ``seed``."""
        rng = np.random.default_rng(seed)
        first, second = [], []
        for label in range(len(self.classes)):
            members = np.flatnonzero(self.labels == label)
            rng.shuffle(members)
            cut = int(round(len(members) * fraction))
            second += members[:cut].tolist()
            first += members[cut:].tolist()
        return self.subset(sorted(first)), self.subset(sorted(second))
