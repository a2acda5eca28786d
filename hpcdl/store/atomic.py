"""Durable writes: a temporary name in the same folder, fsync, rename, fsync of the folder.

Temporary files are named ``.NAME.HOST.PID.RANDOM.tmp`` (HOST: ``host_tag()``),
so that those a killed writer left behind are recognised and removed:
``remove_stale_temporaries``. A folder that vanished under a writer is never
created again by it: writes into a job folder raise FolderGoneError instead.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import secrets
import time
from pathlib import Path
from typing import IO, Callable, Iterator, Optional

from hpcdl.errors import FolderGoneError
from hpcdl.host import alive, host_tag

TEMPORARY = re.compile(r"^\..+\.(?P<host>[0-9a-f]{8})\.(?P<pid>\d+)\.[0-9a-f]{8}\.tmp$")
STALE_AFTER_S = 24 * 3600.0
"""A temporary file this old is stale whoever wrote it (a writer on another host cannot be asked)."""


def _gone(folder: Path) -> FolderGoneError:
    return FolderGoneError(f"{folder}: the folder is gone (deleted while the job ran?); nothing is written "
                           "into it again")


def fsync_folder(folder: Path) -> None:
    """Make the entries of ``folder`` (a rename, a new file) durable."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _temporary(path: Path, mode: str, folder_fd: Optional[int] = None) -> tuple[Path, IO]:
    """A new temporary file beside ``path`` (in the folder ``folder_fd`` when given), named for this host and
    process."""
    for _ in range(100):
        tmp = path.parent / f".{path.name}.{host_tag()}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        try:
            fd = os.open(tmp if folder_fd is None else tmp.name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                         0o600, dir_fd=folder_fd)
        except FileExistsError:
            continue
        except FileNotFoundError:
            raise _gone(path.parent) from None
        return tmp, os.fdopen(fd, mode)
    raise FileExistsError(f"{path.parent}: no free temporary name for {path.name}")


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w") -> Iterator[IO]:
    """Open a temporary file beside ``path``; on success it replaces ``path`` in one rename."""
    path = Path(path)
    tmp, f = _temporary(path, mode)
    try:
        with f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_folder(path.parent)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` atomically."""
    with atomic_open(path, "w") as f:
        f.write(text)


def atomic_save(path: str | os.PathLike, write: Callable[[IO], None]) -> None:
    """Call ``write(binary_file)`` and put the result at ``path`` atomically."""
    with atomic_open(path, "wb") as f:
        write(f)


def write_unsynced(path: str | os.PathLike, data: bytes, folder_fd: Optional[int] = None) -> None:
    """Put ``data`` at ``path`` through a temporary name and a rename, without fsync: one of many files made
    durable together by one ``sync_filesystem`` (a sweep's points, written in bulk). ``folder_fd``: a descriptor
    of the folder of ``path`` held open, which the file is made in (its name alone is taken from ``path``)."""
    path = Path(path)
    tmp, f = _temporary(path, "wb", folder_fd)
    here = (lambda p: p) if folder_fd is None else (lambda p: p.name)  # noqa: E731
    try:
        with f:
            f.write(data)
        os.replace(here(tmp), here(path), src_dir_fd=folder_fd, dst_dir_fd=folder_fd)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(here(tmp), dir_fd=folder_fd)
        raise


def sync_filesystem(folder: str | os.PathLike) -> None:
    """Make every write to the filesystem that holds ``folder`` durable at once (Linux's syncfs)."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        if ctypes.CDLL(None, use_errno=True).syncfs(fd) != 0:
            raise OSError(ctypes.get_errno(), f"syncfs of {folder} failed")
    finally:
        os.close(fd)


def create_once(path: str | os.PathLike, text: str, durable: bool = True, folder_fd: Optional[int] = None) -> bool:
    """Write ``text`` at ``path`` unless a file is there already; True for the one writer that won.

    The content is complete before the name appears (a hard link of a file written first: a nameless one where
    the file system makes them, else one of a temporary name), so readers never see part of it, and of several
    writers racing exactly one wins. ``durable=False``: not synced here, one of many made durable together by
    ``sync_filesystem``. ``folder_fd``: a descriptor of the folder of ``path`` held open, which the file is made
    in (its name alone is taken from ``path``).
    """
    path = Path(path)
    won = _link_nameless(path, text.encode(), durable, folder_fd)
    if won is None:
        won = _link_named(path, text, durable, folder_fd)
    if won and durable and folder_fd is None:
        fsync_folder(path.parent)
    elif won and durable:
        os.fsync(folder_fd)
    return won


def _link_nameless(path: Path, data: bytes, durable: bool, folder_fd: Optional[int]) -> Optional[bool]:
    """create_once through a nameless file: whether it won; None where none can be made or linked (the named way
    then says why)."""
    fd = nameless_file(path.parent, data, folder_fd)
    if fd is None:
        return None
    try:
        if durable:
            os.fsync(fd)
        return link_once(fd, path.name if folder_fd is not None else path, folder_fd)
    finally:
        os.close(fd)


def nameless_file(folder: Path, data: bytes, folder_fd: Optional[int] = None) -> Optional[int]:
    """A descriptor of a new nameless file (O_TMPFILE) in ``folder`` (or ``folder_fd``) holding ``data``, not
    synced, to be named where it is wanted (link_once); None where the file system makes none (NFS, older
    Lustre) or the folder is gone."""
    try:
        fd = os.open(folder if folder_fd is None else ".", os.O_TMPFILE | os.O_WRONLY | os.O_CLOEXEC, 0o600,
                     dir_fd=folder_fd)
    except OSError:
        return None
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    except BaseException:
        os.close(fd)
        raise
    return fd


def link_once(fd: int, name: str | os.PathLike, folder_fd: Optional[int] = None) -> Optional[bool]:
    """Give the file ``fd`` (complete: nameless_file) the name ``name`` (in the folder ``folder_fd`` when given)
    unless a file has it: whether it did; None when it cannot be linked (no /proc, a folder gone, as many links
    to the file as the file system allows)."""
    try:
        os.link(f"/proc/self/fd/{fd}", name, dst_dir_fd=folder_fd)
    except FileExistsError:
        return False
    except OSError:
        return None
    return True


def _link_named(path: Path, text: str, durable: bool, folder_fd: Optional[int]) -> bool:
    """create_once through a file of a temporary name beside ``path``: whether it won."""
    tmp, f = _temporary(path, "w", folder_fd)
    here = (lambda p: p) if folder_fd is None else (lambda p: p.name)  # noqa: E731
    try:
        with f:
            f.write(text)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        try:
            os.link(here(tmp), here(path), src_dir_fd=folder_fd, dst_dir_fd=folder_fd)
        except FileExistsError:
            return False
        return True
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(here(tmp), dir_fd=folder_fd)


def remove_stale_temporaries(folder: str | os.PathLike, stale_after_s: float = STALE_AFTER_S) -> list[Path]:
    """Remove the temporary files in ``folder`` whose writer died (on this host) or that are older than
    ``stale_after_s``; returns those removed."""
    removed = []
    now = time.time()
    with contextlib.suppress(FileNotFoundError), os.scandir(folder) as entries:
        for entry in entries:
            match = TEMPORARY.match(entry.name)
            if match is None or not entry.is_file(follow_symlinks=False):
                continue
            ours = match["host"] == host_tag()
            dead = ours and not alive(int(match["pid"]))
            old = now - entry.stat(follow_symlinks=False).st_mtime > stale_after_s
            if dead or old:
                try:
                    os.unlink(entry.path)
                except OSError:  # removed by another cleaner, or a folder this process may only read
                    continue
                removed.append(Path(entry.path))
    return removed


def make_folder(path: str | os.PathLike) -> Path:
    """Create ``path`` and its missing parents, but never the job folder this process runs for.

    Inside a job (``HPCDL_JOB_FOLDER`` set) the folders below the job folder are made one level at a
    time from it; a deleted job folder raises FolderGoneError instead of being made again.
    """
    path = Path(path).absolute()
    job = os.environ.get("HPCDL_JOB_FOLDER")
    if not job or not path.is_relative_to(Path(job).absolute()):
        path.mkdir(parents=True, exist_ok=True)
        return path
    current = Path(job).absolute()
    if not current.is_dir():
        raise _gone(current)
    for part in path.relative_to(current).parts:
        current = current / part
        try:
            current.mkdir(mode=0o700, exist_ok=True)
        except FileNotFoundError:
            raise _gone(current.parent) from None
    return path
