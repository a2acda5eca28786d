"""Files over the SSH connection as a tar stream: plain files and folders only, nothing outside the target."""

from __future__ import annotations

import os
import shutil
import tarfile
from pathlib import Path, PurePosixPath
from typing import IO, Iterable

from hpcdl.errors import HpcdlError


def pack(stream: IO[bytes], folder: Path, names: Iterable[str]) -> None:
    """Write ``folder``'s files ``names`` (relative paths) to ``stream`` as a tar."""
    with tarfile.open(fileobj=stream, mode="w|") as tar:
        for name in names:
            tar.add(folder / name, arcname=name, recursive=False)


def pack_tree(stream: IO[bytes], folder: Path) -> None:
    """Write every file and folder under ``folder`` to ``stream`` as a tar (links are not followed)."""
    names = []
    for top, folders, files in os.walk(folder):
        names += [os.path.relpath(os.path.join(top, name), folder) for name in folders + files]
    pack(stream, folder, names)


def unpack(stream: IO[bytes], into: Path) -> int:
    """Unpack the tar on ``stream`` into ``into``: its files (owner-only, executable kept) and folders; a link,
    a device or a name leaving ``into`` is refused (HpcdlError). Returns the number of files."""
    files = 0
    with tarfile.open(fileobj=stream, mode="r|") as tar:
        for member in tar:
            name = PurePosixPath(member.name)
            if name.is_absolute() or ".." in name.parts or not (member.isfile() or member.isdir()):
                raise HpcdlError(f"refused {member.name!r} in the files sent: only plain files and folders inside")
            path = into.joinpath(*name.parts)
            if member.isdir():
                path.mkdir(mode=0o700, parents=True, exist_ok=True)
                continue
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            source = tar.extractfile(member)
            with source, open(path, "xb", opener=lambda p, f: os.open(p, f | os.O_NOFOLLOW,
                                                                        0o700 if member.mode & 0o100 else 0o600)) as f:
                shutil.copyfileobj(source, f)
            files += 1
    return files
