"""Reading a store that other users can reach: every file is opened once, never through a symbolic link,
and trusted only when the opened file itself (fstat) is this user's alone.

A store root, a job folder and each file read from it must be owned by this user and not writable by
group or others; anything else raises UnsafeFolderError naming the path and why. Files are opened
relative to a folder descriptor (``O_NOFOLLOW`` at every step), so a folder or file swapped for a link
between a check and a read is never followed: what is checked is what is read.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import stat
from pathlib import Path, PurePath
from typing import IO, Any, Optional

from hpcdl.errors import HpcdlError

JOB_ID = re.compile(r"^[0-9]{6}-[0-9]{6}-[0-9a-f]{4}$")
"""How ``new_job_folder`` names jobs: YYMMDD-HHMMSS-xxxx."""
JOB_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:@+-]*$")
"""What a job can be asked for by: an id, a prefix of one, a scheduler id or 'last' (no path)."""
_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # NONBLOCK: a planted FIFO cannot hang us


class UnsafeFolderError(HpcdlError):
    """A store, job folder or file is not owned by this user, is writable by others, or is a link."""


class NotRegularFileError(UnsafeFolderError):
    """A job's file is a FIFO, socket, device or folder: never read (and never waited on: O_NONBLOCK)."""


def check_job_key(key: str) -> None:
    """HpcdlError unless ``key`` can name a job without naming a path (``../x``, ``/etc``)."""
    if not JOB_KEY.match(key):
        raise HpcdlError(f"{key!r} is not a job id: give an id (like 261203-172419-ab12), a unique prefix of "
                         "one, a scheduler job id or 'last'; paths are not accepted")


def unsafe_reason(info: os.stat_result, kind: int) -> str:
    """Why a file with ``info`` cannot be trusted ('' when it can): ``kind`` is stat.S_IFDIR or S_IFREG."""
    if stat.S_ISLNK(info.st_mode):
        return "is a symbolic link"
    if stat.S_IFMT(info.st_mode) != kind:
        return "is not a folder" if kind == stat.S_IFDIR else "is not a regular file"
    if info.st_uid != os.getuid():
        return f"is owned by uid {info.st_uid}, not by you (uid {os.getuid()})"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"is writable by group or others ({stat.filemode(info.st_mode)}; chmod go-w fixes it)"
    return ""


def _open(path: str, flags: int, kind: int, dir_fd: Optional[int] = None) -> int:
    """Open ``path`` (its last part, relative to ``dir_fd`` when given) and check what was opened."""
    name = path if dir_fd is None else os.path.basename(path)
    try:
        fd = os.open(name, flags, dir_fd=dir_fd)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):  # a link where O_NOFOLLOW refuses to go
            raise UnsafeFolderError(f"{path}: is a symbolic link or not a folder; refusing to read it") from None
        reason = unsafe_reason(os.lstat(name, dir_fd=dir_fd), kind) if e.errno == errno.EACCES else ""
        if reason:  # another user's (in a shared store): refused as it is when it can be opened
            raise UnsafeFolderError(f"{path}: {reason}; refusing to read it") from None
        raise
    info = os.fstat(fd)
    reason = unsafe_reason(info, kind)
    if reason:
        os.close(fd)
        odd = kind == stat.S_IFREG and not stat.S_ISREG(info.st_mode)
        raise (NotRegularFileError if odd else UnsafeFolderError)(f"{path}: {reason}; refusing to read it")
    return fd


def open_folder(folder: Path, parent_fd: Optional[int] = None) -> int:
    """A descriptor of ``folder`` (not followed if it is a link; its last part relative to ``parent_fd``, a
    descriptor of its parent, when given), checked to be this user's alone."""
    return _open(os.fspath(folder), _FOLDER, stat.S_IFDIR, dir_fd=parent_fd)


def open_own_folder(folder: Path, create: bool) -> Optional[int]:
    """A descriptor of this user's private ``folder`` in a store (made 0700 when ``create`` and missing), checked
    to be theirs alone as open_folder does; None when it is missing."""
    if create:
        with contextlib.suppress(FileExistsError):
            os.mkdir(folder, 0o700)
    try:
        return open_folder(folder)
    except FileNotFoundError:
        return None


def check_store(root: Path) -> bool:
    """UnsafeFolderError unless the store folder ``root`` is this user's alone (False) or shared safely (True):
    with the sticky bit (like /tmp: each entry can be renamed or removed only by its owner), or a group's
    folder with the setgid bit that others may not write. In a shared store each job folder is its creator's,
    owner-only, and other users' folders are never trusted."""
    try:
        fd = os.open(root, _FOLDER)
    except OSError as e:
        if e.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        reason = "is a symbolic link or not a folder"
    else:
        info = os.fstat(fd)
        os.close(fd)
        mode = info.st_mode
        if mode & stat.S_ISVTX or mode & stat.S_ISGID and mode & stat.S_IWGRP and not mode & stat.S_IWOTH:
            return True
        reason = unsafe_reason(info, stat.S_IFDIR)
    if reason:
        raise UnsafeFolderError(f"job store {root}: {reason}; a store must be yours alone (others could plant "
                                "or swap jobs in it), or shared: with the sticky bit (chmod +t), or a group's "
                                "folder with setgid that others may not write (chmod g+s,o-w)")
    return False


def open_job_file(folder: Path, name: str | PurePath, folder_fd: Optional[int] = None) -> IO[bytes]:
    """``folder/name`` opened for reading once, each step without following a link and checked.

    ``folder_fd``: a descriptor of ``folder`` held open (open_folder), so that files read one after another
    come from the same folder even while a co-user renames one of its parents away and back.
    FileNotFoundError when it is missing; UnsafeFolderError when any step is not this user's alone.
    """
    parts = os.fspath(name).split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise UnsafeFolderError(f"{name}: not a path inside the job folder {folder}")
    fd, path = open_folder(folder) if folder_fd is None else os.dup(folder_fd), os.fspath(folder)
    try:
        for part in parts[:-1]:
            path = os.path.join(path, part)
            inner = _open(path, _FOLDER, stat.S_IFDIR, dir_fd=fd)
            os.close(fd)
            fd = inner
        file_fd = _open(os.path.join(path, parts[-1]), _FILE, stat.S_IFREG, dir_fd=fd)
    finally:
        os.close(fd)
    os.set_blocking(file_fd, True)
    return os.fdopen(file_fd, "rb")


def read_job_file(folder: Path, name: str | PurePath, folder_fd: Optional[int] = None) -> Optional[bytes]:
    """The content of ``folder/name`` read safely (see open_job_file), or None when it is missing."""
    try:
        with open_job_file(folder, name, folder_fd) as f:
            return f.read()
    except FileNotFoundError:
        return None


def load_pickle(folder: Path, name: str) -> Any:
    """Unpickle ``folder/name`` (a function or its result) from the file that was checked, never by path again."""
    import cloudpickle

    with open_job_file(folder, name) as f:
        return cloudpickle.load(f)


def open_target(target: Path) -> int:
    """A descriptor of the folder results are fetched into, made (mode 0700) when missing; UnsafeFolderError
    when it is a link or not this user's (another user's folder, or a link planted in a shared one)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.mkdir(target, 0o700)
    try:
        fd = os.open(target, _FOLDER)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            raise UnsafeFolderError(f"{target}: is a symbolic link or not a folder; refusing to write into it") from None
        raise
    owner = os.fstat(fd).st_uid
    if owner != os.getuid():
        os.close(fd)
        raise UnsafeFolderError(f"{target}: is owned by uid {owner}, not by you (uid {os.getuid()}); refusing to "
                                "write into it (fetch into a new folder)")
    return fd


def _target_folder(target_fd: int, parts: list[str], target: str) -> int:
    """A descriptor of the folder ``parts`` inside the fetch target, each made (0700) when missing, none a link
    or another user's."""
    fd = os.dup(target_fd)
    for part in parts:
        with contextlib.suppress(FileExistsError):
            os.mkdir(part, 0o700, dir_fd=fd)
        target = os.path.join(target, part)
        try:
            inner = _open(target, _FOLDER, stat.S_IFDIR, dir_fd=fd)
        finally:
            os.close(fd)
        fd = inner
    return fd


def copy_out(folder: Path, name: str | PurePath, target_fd: int, target: Path) -> None:
    """Copy ``folder/name`` (read safely) to ``name`` in the fetch target (``target_fd``, from open_target):
    written to a new file (O_EXCL, mode 0600) renamed into place, so that nothing is ever written through a
    file or link another user planted under that name."""
    *parts, base = PurePath(name).parts
    with open_job_file(folder, name) as source:
        into = _target_folder(target_fd, parts, os.fspath(target))
        temporary = f".{base}.{secrets.token_hex(4)}.tmp"
        try:
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                         dir_fd=into)
            try:
                with os.fdopen(fd, "wb") as out:
                    while chunk := source.read(1 << 20):
                        out.write(chunk)
                    out.flush()
                    os.fsync(out.fileno())
                os.rename(temporary, base, src_dir_fd=into, dst_dir_fd=into)
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(temporary, dir_fd=into)
                raise
        finally:
            os.close(into)
