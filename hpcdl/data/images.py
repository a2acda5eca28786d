"""A lazy image datastore over class folders (or a CSV of path,label), on disk or object storage.

Only paths are held; an image is read when a batch needs it. Roots may be local
folders or URLs (s3://bucket/prefix, gs://..., and anything fsspec reads), with
no change to the training code. Items are (uint8 CxHxW tensor, label index); the
trainer turns them into float32 in [0, 1] on the device, so worker processes
pass a quarter of the bytes.
"""

from __future__ import annotations

import csv
import io
import os
import warnings
from collections import Counter
from typing import Any, Optional, Sequence

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

from hpcdl.data.listing import class_folders, filesystem, images_in
from hpcdl.errors import ConfigError, HpcdlError

MODES = {1: "L", 3: "RGB"}
BAD_FILE_POLICIES = ("error", "skip")


class BadImageError(HpcdlError, OSError):
    """An image file that cannot be read; the message names the file and the problem."""


class ImageDatastore(Dataset):
    """Images under ``root/<label>/`` (or listed in ``labels_csv``); items are (uint8 tensor, label index)."""

    def __init__(self, root: str | os.PathLike, *, image_size: Optional[Sequence[int]] = None,
                 channels: Optional[int] = None, labels_csv: Optional[str | os.PathLike] = None,
                 on_bad_file: str = "error") -> None:
        if on_bad_file not in BAD_FILE_POLICIES:
            raise ConfigError(f"data.on_bad_file: {on_bad_file!r} is not allowed; choose one of error, skip")
        self.fs, self.root = filesystem(root)
        self.local = "file" in (self.fs.protocol if isinstance(self.fs.protocol, tuple) else (self.fs.protocol,))
        if not self.fs.isdir(self.root):
            raise ConfigError(f"image datastore: {root} is not a folder")  # a CSV's root too
        paths, names = self._from_csv(labels_csv) if labels_csv else self._from_folders(root)
        self.classes = sorted(set(names))
        index = {name: i for i, name in enumerate(self.classes)}
        self.paths: list[str] = paths
        self.labels = np.asarray([index[n] for n in names], dtype=np.int64)
        self.image_size = tuple(image_size) if image_size else None
        self.on_bad_file = on_bad_file
        self.channels = channels if channels is not None else self._channels_of(paths[0])
        if self.channels not in MODES:
            raise ConfigError(f"image datastore: channels must be 1 or 3, got {self.channels}")

    def _from_folders(self, root: Any) -> tuple[list[str], list[str]]:
        paths, names = [], []
        for folder in class_folders(self.fs, self.root, str(root)):
            files = images_in(self.fs, folder)
            paths += files
            names += [folder.rstrip("/").rsplit("/", 1)[-1]] * len(files)
        return paths, names

    def _from_csv(self, labels_csv: Any) -> tuple[list[str], list[str]]:
        with open(labels_csv, newline="") as f:
            rows = [row for row in csv.reader(f) if row and not row[0].startswith("#")]
        if rows and rows[0][:2] == ["path", "label"]:
            rows = rows[1:]
        if not rows:
            raise ConfigError(f"image datastore: {labels_csv} lists no images")
        bad = [row for row in rows if len(row) != 2]
        if bad:
            raise ConfigError(f"image datastore: {labels_csv}: rows must be path,label; got {bad[0]}")
        paths = [p if self.fs.isfile(p) else f"{self.root}/{p}" for p, _ in rows]
        return paths, [label for _, label in rows]

    def _channels_of(self, path: str) -> int:
        with self.fs.open(path, "rb") as f, Image.open(f) as image:
            return 1 if image.mode in ("1", "L", "I", "I;16", "F", "LA") else 3

    def __len__(self) -> int:
        return len(self.paths)

    def reopen(self) -> None:
        """A filesystem of this process's own (a forked worker cannot share an object store's event loop)."""
        if getattr(self.fs, "async_impl", False):
            self.fs = type(self.fs)(**self.fs.storage_options, skip_instance_cache=True)

    def read_bytes(self, index: int) -> Optional[bytes]:
        """The undecoded file of image ``index``; None for an unreadable file when skipping."""
        path = self.paths[index]
        try:
            with (open(path, "rb") if self.local else self.fs.open(path, "rb")) as f:  # local: no fsspec layer
                return f.read()
        except OSError as e:
            return self._bad(path, e)

    def decode(self, index: int, data: bytes, draft: Optional[Sequence[int]] = None) -> Optional[np.ndarray]:
        """Image ``index``'s file ``data`` as an HxWxC (or HxW) uint8 array, at image_size if set.

        ``draft`` ([height, width]) lets a JPEG decode at a reduced scale (DCT scaling) that stays at least
        that large; None for a bad file when skipping.
        """
        size = self.image_size or draft
        try:
            with Image.open(io.BytesIO(data)) as image:
                if size and image.format == "JPEG":
                    image.draft(MODES[self.channels], (size[1], size[0]))
                image = image.convert(MODES[self.channels])  # decodes everything: truncation shows here
                if self.image_size and image.size != (self.image_size[1], self.image_size[0]):
                    image = image.resize((self.image_size[1], self.image_size[0]), Image.BILINEAR)
                return np.array(image, dtype=np.uint8)  # a writable copy for torch
        except (OSError, ValueError, Image.DecompressionBombError) as e:
            return self._bad(self.paths[index], e)

    def _bad(self, path: str, error: Exception) -> None:
        if self.on_bad_file == "skip":
            warnings.warn(f"skipping unreadable image {path}: {error}", stacklevel=3)
            return None
        raise BadImageError(f"cannot read image {path}: {error}") from error

    def read(self, index: int, draft: Optional[Sequence[int]] = None) -> Optional[np.ndarray]:
        """The decoded HxWxC (or HxW) uint8 array of image ``index``; None for a bad file when skipping."""
        data = self.read_bytes(index)
        return None if data is None else self.decode(index, data, draft)

    def item(self, index: int, draft: Optional[Sequence[int]] = None) -> Optional[tuple[torch.Tensor, int]]:
        """(uint8 CxHxW tensor, label index) of image ``index``, decoded no smaller than ``draft``."""
        array = self.read(index, draft)
        return None if array is None else (as_chw(array), int(self.labels[index]))

    def __getitem__(self, key: Any) -> Optional[tuple[torch.Tensor, int]]:
        return self.item(key[0] if isinstance(key, tuple) else key)

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

    def shuffle(self, seed: int = 0) -> "ImageDatastore":
        """The same images in an order repeatable from ``seed``."""
        return self.subset(np.random.default_rng(seed).permutation(len(self)).tolist())

    def split(self, amount: float | int, *, seed: int = 0) -> tuple["ImageDatastore", "ImageDatastore"]:
        """Hold out ``amount`` of each label (a fraction in [0, 1) or a count); returns (rest, held out)."""
        if isinstance(amount, float) and not 0 <= amount < 1:
            raise ConfigError(f"split: a fraction must be in [0, 1), got {amount}")
        rng = np.random.default_rng(seed)
        first, second = [], []
        for label in range(len(self.classes)):
            members = np.flatnonzero(self.labels == label)
            rng.shuffle(members)
            cut = int(round(len(members) * amount)) if isinstance(amount, float) else int(amount)
            if cut > len(members):
                raise ConfigError(f"split: {cut} images of label {self.classes[label]!r} asked, it has {len(members)}")
            second += members[:cut].tolist()
            first += members[cut:].tolist()
        return self.subset(sorted(first)), self.subset(sorted(second))


def as_chw(array: np.ndarray) -> torch.Tensor:
    """A decoded HxWxC (or HxW) uint8 array as a contiguous CxHxW tensor."""
    tensor = torch.from_numpy(array)
    return tensor.unsqueeze(0) if tensor.ndim == 2 else tensor.permute(2, 0, 1).contiguous()


def image_datastore(name: str = "digits", root: Optional[str] = None, image_size: Optional[Sequence[int]] = None,
                    labels_csv: Optional[str] = None, on_bad_file: str = "error") -> ImageDatastore:
    """The built-in data section's datastore: scikit-learn's digits written as PNG files, or a folder's images."""
    if name == "digits":
        from hpcdl.data.digits import digits_folder

        root = str(digits_folder(root))
    return ImageDatastore(root, image_size=image_size, labels_csv=labels_csv, on_bad_file=on_bad_file)
