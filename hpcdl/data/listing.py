"""What an image root holds: class folders and their image files, on disk or object storage (no torch).

One rule for the datastore on the ranks and for the job plan at submission:
a root is a folder of class folders, each holding at least one image.
"""

from __future__ import annotations

import os
from typing import Any, Optional

from hpcdl.errors import ConfigError

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff")


def filesystem(root: str | os.PathLike) -> tuple[Any, str]:
    """The fsspec filesystem of ``root`` (a folder or a URL) and its path there."""
    import fsspec

    fs, path = fsspec.core.url_to_fs(str(root))
    return fs, path.rstrip("/")


def class_folders(fs: Any, root: str, shown: str) -> list[str]:
    """The class folders under ``root``, sorted; ConfigError when it is no folder or holds none."""
    if not fs.isdir(root):
        raise ConfigError(f"image datastore: {shown} is not a folder")
    folders = sorted(e["name"] for e in fs.ls(root, detail=True) if e["type"] == "directory")
    if not folders:
        raise ConfigError(f"image datastore: {shown} holds no class folders")
    return folders


def images_in(fs: Any, folder: str) -> list[str]:
    """The image files of one class folder, sorted; ConfigError when there are none."""
    files = sorted(f for f in fs.ls(folder, detail=False) if f.lower().endswith(IMAGE_SUFFIXES))
    if not files:
        raise ConfigError(f"image datastore: class folder {folder} holds no images ({', '.join(IMAGE_SUFFIXES)})")
    return files


def _has_local_image(folder: str) -> bool:
    with os.scandir(folder) as entries:  # stops at the first image: cheap on folders of a million files
        return any(e.name.lower().endswith(IMAGE_SUFFIXES) and e.is_file() for e in entries)


def check_image_root(root: str | os.PathLike, labels_csv: Optional[str | os.PathLike] = None) -> None:
    """ConfigError unless ``root`` can feed a datastore: a folder of class folders with images (or a CSV)."""
    fs, path = filesystem(root)
    if labels_csv is not None:
        if not os.path.isfile(labels_csv):
            raise ConfigError(f"data.labels_csv: {labels_csv} is not a file")
        if not fs.isdir(path):
            raise ConfigError(f"image datastore: {root} is not a folder")
        return
    for folder in class_folders(fs, path, str(root)):
        local = "file" in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,))
        if local and not _has_local_image(folder):
            raise ConfigError(f"image datastore: class folder {folder} holds no images "
                              f"({', '.join(IMAGE_SUFFIXES)})")
        if not local:
            images_in(fs, folder)
