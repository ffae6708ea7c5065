"""Reading a file named by input or by a stored file, safely: one bounded read of a regular
file, and text only when it is UTF-8.

Every file the workbench reads whole (``run.json``, an index, a claims file, a mask, a
sweep spec, a chunk, a prompt file, a training text) is read by :func:`read_bounded`:
opened without blocking (a FIFO put in its place cannot hang the reader), optionally
without following a symlink in its last component (stored files), refused unless it is a
regular file, and read to at most ``limit`` bytes, so ``/dev/zero`` or a huge file cannot
exhaust memory. :func:`decode_text` refuses what is not UTF-8 text and names the encoding
it looks like. Every refusal is one :class:`WorkbenchError` line naming the file.

Examples:
    >>> read_bounded("/dev/zero", 10, what="mask")
    Traceback (most recent call last):
    ...
    workbench.core.errors.WorkbenchError: mask /dev/zero is not a regular file (a character device)
    >>> try:
    ...     decode_text("hi".encode("utf-16-le"), what="notes.txt")
    ... except WorkbenchError as exc:
    ...     print(exc)  # doctest: +NORMALIZE_WHITESPACE
    notes.txt is not UTF-8 text: it holds NUL bytes (the first at byte 1) and looks like
    UTF-16 little-endian text; save it as UTF-8
"""

from __future__ import annotations

import codecs
import errno
import os
import stat

from workbench.core.errors import WorkbenchError, printable

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"),
          (stat.S_ISSOCK, "a socket"))

_BOMS = ((codecs.BOM_UTF32_LE, "UTF-32 little-endian"),
         (codecs.BOM_UTF32_BE, "UTF-32 big-endian"),
         (codecs.BOM_UTF16_LE, "UTF-16 little-endian"),
         (codecs.BOM_UTF16_BE, "UTF-16 big-endian"))
"""Byte-order marks of encodings that are not UTF-8 (UTF-32's first: it starts like UTF-16's)."""


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
    shown = _Shown(path)
    try:
        fd = os.open(path, flags)
    except ValueError:  # a NUL byte in the name
        raise WorkbenchError(f"{what} {shown} is not a file name") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow:
            raise WorkbenchError(f"{what} {shown} is a symbolic link, not a regular "
                                 "file") from None
        raise WorkbenchError(f"cannot read {what} {shown}: {exc.strerror}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = next((k for test, k in _KINDS if test(mode)), "something else")
            raise WorkbenchError(f"{what} {shown} is not a regular file ({kind})")
        with os.fdopen(fd, "rb", closefd=False) as fh:
            data = fh.read() if limit is None else fh.read(limit + 1)
    except OSError as exc:
        raise WorkbenchError(f"cannot read {what} {shown}: {exc.strerror}") from None
    finally:
        os.close(fd)
    if limit is not None and len(data) > limit:
        raise WorkbenchError(f"{what} {shown} is larger than {size_text(limit)}")
    return data


class _Shown:
    """A path as a message prints it (:func:`printable`), worked out only if printed."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = path

    def __str__(self) -> str:
        return printable(str(self.path))


def size_text(n_bytes: int) -> str:
    """``16 MiB``, ``512 KiB`` or ``100 bytes``."""
    for shift, unit in ((20, "MiB"), (10, "KiB")):
        if n_bytes >= 1 << shift and n_bytes % (1 << shift) == 0:
            return f"{n_bytes >> shift} {unit}"
    return f"{n_bytes} bytes"


def decode_text(data: bytes, *, what: str) -> str:
    """``data`` as UTF-8 text (a UTF-8 byte-order mark is dropped).

    Args:
        data: the bytes of a file.
        what: the file, for messages.

    Returns:
        The text.

    Raises:
        WorkbenchError: a byte-order mark of another encoding, a NUL byte (text in UTF-16
            or UTF-32 without a mark, or binary data) or bytes that are not UTF-8; the
            line names the file and the encoding the bytes look like.
    """
    for bom, encoding in _BOMS:
        if data.startswith(bom):
            raise WorkbenchError(f"{what} is not UTF-8 text: it starts with the byte-order "
                                 f"mark of {encoding}; save it as UTF-8")
    nul = data.find(b"\0")
    if nul >= 0:
        raise WorkbenchError(f"{what} is not UTF-8 text: it holds NUL bytes (the first at "
                             f"byte {nul}) and looks like {_with_nuls(data)}; save it as UTF-8")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        byte = data[exc.start]
        raise WorkbenchError(f"{what} is not UTF-8 text: byte 0x{byte:02x} at byte {exc.start} "
                             f"is not valid UTF-8; it looks like {_without_nuls(data)}; save "
                             "it as UTF-8") from None


def read_text(path: str | os.PathLike[str], *, what: str, limit: int) -> str:
    """:func:`read_bounded` then :func:`decode_text`: the UTF-8 text of a regular file of at
    most ``limit`` bytes, or one :class:`WorkbenchError` line naming the file."""
    return decode_text(read_bounded(path, limit, what=what),
                       what=f"{what} {printable(os.fsdecode(path))}")


def _with_nuls(data: bytes) -> str:
    """The encoding bytes holding NULs look like: text of ASCII letters in UTF-16 or
    UTF-32 has NULs at fixed places of each 2- or 4-byte unit."""
    sample = data[:4096]
    units = len(sample) // 4 * 4
    if units and all(sample[i:i + 3] == b"\0\0\0" for i in range(1, units, 4)):
        return "UTF-32 little-endian text"
    if units and all(sample[i:i + 3] == b"\0\0\0" for i in range(0, units, 4)):
        return "UTF-32 big-endian text"
    odd, even = sample[1::2], sample[0::2]
    if odd and odd.count(0) >= 0.3 * len(odd) and even.count(0) < 0.1 * len(even):
        return "UTF-16 little-endian text"
    if even and even.count(0) >= 0.3 * len(even) and odd.count(0) < 0.1 * len(odd):
        return "UTF-16 big-endian text"
    return "binary data, not text"


def _without_nuls(data: bytes) -> str:
    """What bytes that are not UTF-8 (and hold no NUL) look like: mostly printable as
    Windows-1252 means a legacy 8-bit encoding; many control bytes mean binary data."""
    sample = data[:4096]
    controls = sum(1 for b in sample if b < 0x20 and b not in b"\t\n\r\f")
    if controls > 0.05 * len(sample):
        return "binary data, not text"
    return "Latin-1 or Windows-1252 text"


def is_regular_file(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a regular file (symlinks followed), without opening it."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False
