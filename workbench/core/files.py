"""Reading a file named by input or by a stored file, safely: one bounded read of a regular
file.

Every file the workbench reads whole (``run.json``, an index, a claims file, a mask, a
sweep spec, a chunk) is read by :func:`read_bounded`: opened without following a symlink
in its last component and without blocking (a FIFO put in its place cannot hang the
reader), refused unless it is a regular file, and read to at most ``limit`` bytes, so
``/dev/zero`` or a huge file cannot exhaust memory.

Examples:
    >>> read_bounded("/dev/zero", 10, what="mask")
    Traceback (most recent call last):
    ...
    workbench.core.errors.WorkbenchError: mask /dev/zero is not a regular file
"""

from __future__ import annotations

import errno
import os
import stat

from workbench.core.errors import WorkbenchError, printable


def read_bounded(path: str | os.PathLike[str], limit: int | None, *, what: str,
                 follow: bool = True) -> bytes:
    """The bytes of regular file ``path``, at most ``limit`` of them.

    Args:
        path: the file.
        limit: the most bytes a real one has (``None``: no limit, for a file whose size
            is already known, e.g. from a manifest).
        what: what the file is, for messages (``"head mask"``, ``"run.json of run X"``).
        follow: follow a symlink in the last component (``False`` refuses one).

    Raises:
        WorkbenchError: it cannot be opened, is not a regular file, or is larger than
            ``limit`` (one line naming it).
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | (0 if follow else os.O_NOFOLLOW)
    shown = printable(str(path))
    try:
        fd = os.open(path, flags)
    except ValueError:  # a NUL byte in the name
        raise WorkbenchError(f"{what} {shown} is not a file name") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow:
            raise WorkbenchError(f"{what} {shown} is a symbolic link, not a regular "
                                 "file") from None
        raise WorkbenchError(f"cannot read {what} {shown} ({exc.strerror})") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise WorkbenchError(f"{what} {shown} is not a regular file")
        with os.fdopen(fd, "rb", closefd=False) as fh:
            data = fh.read() if limit is None else fh.read(limit + 1)
    except OSError as exc:
        raise WorkbenchError(f"cannot read {what} {shown} ({exc.strerror})") from None
    finally:
        os.close(fd)
    if limit is not None and len(data) > limit:
        raise WorkbenchError(f"{what} {shown} is larger than {_size(limit)}: not a real one")
    return data


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):g} {unit}"
    return f"{n} bytes"
