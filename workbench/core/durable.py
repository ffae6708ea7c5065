"""Putting files on disk so that they survive a crash: fsync of files, trees and folders.

A rename is atomic, but only durable once the folder that holds it is flushed too, and a
file's data only once the file itself is: a run moved into place before its Parquet files
reach the disk can come back after a power cut as a "complete" run with empty tables. So
whoever finishes a folder flushes every file in it, then every folder (bottom up), then
renames it, then flushes the parent (:func:`fsync_tree`, :func:`fsync_dir`).

:func:`write_atomic` writes a small file through a temporary sibling that it removes if
anything fails (a full disk leaves no half-written ``.tmp`` behind).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path

# fsync of a folder is refused by some filesystems (EINVAL) and means nothing on others;
# a folder that cannot be flushed is no worse than before, so these are not errors.
_UNSUPPORTED = {errno.EINVAL, errno.ENOTSUP, errno.EBADF}


def fsync_file(path: str | os.PathLike[str]) -> None:
    """Flush one regular file's data and metadata to disk (a symlink is not followed)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Flush a folder's entries (the names created, renamed or removed in it)."""
    if not hasattr(os, "O_DIRECTORY"):  # Windows cannot open a folder; nothing to do
        return
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in _UNSUPPORTED:
            raise
    finally:
        os.close(fd)


def fsync_tree(root: str | os.PathLike[str]) -> int:
    """Flush every regular file under ``root``, then every folder, deepest first.

    Symlinks are neither followed nor flushed: they point outside what is being finished.

    Raises:
        OSError: a file or folder could not be opened or flushed.

    Returns:
        How many files were flushed.
    """
    def unreadable(exc: OSError) -> None:  # a folder that cannot be listed is not flushed
        raise exc

    n_files, folders = 0, []
    for folder, _dirs, files in os.walk(root, onerror=unreadable, followlinks=False):
        folders.append(folder)
        for name in files:
            path = os.path.join(folder, name)
            if stat.S_ISREG(os.lstat(path).st_mode):
                fsync_file(path)
                n_files += 1
    for folder in reversed(folders):
        fsync_dir(folder)
    return n_files


def _write_bytes(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def write_atomic(path: str | os.PathLike[str], data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically and durably.

    The bytes go to ``.<name>.tmp`` beside it, which is flushed, renamed over ``path``, and
    the folder flushed. On any failure (a full disk, a read-only filesystem) the temporary
    file is removed and the error raised; ``path`` keeps its old content.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            _write_bytes(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        remove_quietly(tmp)
        raise
    fsync_dir(path.parent)


def reserve(path: str | os.PathLike[str], size: int) -> None:
    """Create ``path`` holding ``size`` bytes already allocated on disk, so that
    :func:`overwrite_reserved` can later write into it even when the disk is full."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        _write_bytes(fd, b" " * size)  # written, not sparse: the blocks are really taken
        os.fsync(fd)
    finally:
        os.close(fd)


def overwrite_reserved(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` in place into a file made by :func:`reserve` (no new blocks are
    needed) and cut it to length.

    Raises:
        ValueError: ``data`` is longer than the reserved file.
    """
    fd = os.open(path, os.O_WRONLY)
    try:
        if len(data) > os.fstat(fd).st_size:
            raise ValueError(f"{len(data)} bytes do not fit in the reserved {path}")
        _write_bytes(fd, data)
        os.ftruncate(fd, len(data))
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_quietly(path: str | os.PathLike[str]) -> None:
    """Remove a file if it exists, ignoring any error (used while already failing)."""
    with contextlib.suppress(OSError):
        os.unlink(path)
