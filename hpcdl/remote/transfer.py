"""Files over the SSH connection as a tar stream: plain files and folders only, nothing outside the target; only
the files changed since the last time, the login node keeping the tree it was sent last."""

from __future__ import annotations

import hashlib
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


def digests(folder: Path, names: Iterable[str]) -> dict[str, str]:
    """Each file's SHA-256 (relative name -> hex digest)."""
    found = {}
    for name in names:
        digest = hashlib.sha256()
        with open(folder / name, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):  # not hashlib.file_digest: Python 3.10 lacks it
                digest.update(block)
        found[name] = digest.hexdigest()
    return found


def fill_from(kept: Path, code: Path, files: dict[str, str]) -> list[str]:
    """Complete ``code`` (the files sent) with the unchanged files of the tree ``kept`` from the last time, each
    checked against its digest in ``files``; the names that are neither sent nor kept as they should be."""
    missing = []
    for name, digest in files.items():
        target = code.joinpath(*PurePosixPath(name).parts)
        if target.is_file():
            continue
        source = kept.joinpath(*PurePosixPath(name).parts)
        if ".." in PurePosixPath(name).parts or not source.is_file() or source.is_symlink() or \
                digests(kept, [name])[name] != digest:
            missing.append(name)
            continue
        target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        shutil.copy2(source, target)
    return missing


def keep(code: Path, kept: Path) -> None:
    """Make ``code`` the tree kept for next time (in place of the one before, by renames)."""
    old = kept.with_name(kept.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if kept.exists():
        os.rename(kept, old)
    os.rename(code, kept)
    shutil.rmtree(old, ignore_errors=True)
