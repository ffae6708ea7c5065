"""Reading a file a user names: a regular file, at most so many bytes, and, for text, UTF-8.

A path given on the command line or in a config (``record --file``, a prompt-set file, a
claims file, a head mask, a training text) may name anything: ``/dev/zero`` (endless),
a FIFO (blocks on open until a writer comes), a directory, or a file in UTF-16 or in no
text encoding at all. :func:`read_file` opens without blocking, refuses what is not a
regular file and reads at most its cap, so it always returns or refuses at once;
:func:`decode_text` refuses what is not UTF-8 text and names the encoding it looks like.
Every refusal is one :class:`WorkbenchError` line naming the file.

Examples:
    >>> try:
    ...     read_file("/dev/zero", what="prompt file", limit=1 << 20)
    ... except WorkbenchError as exc:
    ...     print(exc)
    cannot read prompt file /dev/zero: it is a character device, not a regular file
    >>> try:
    ...     decode_text("hi".encode("utf-16-le"), what="notes.txt")
    ... except WorkbenchError as exc:
    ...     print(exc)  # doctest: +NORMALIZE_WHITESPACE
    notes.txt is not UTF-8 text: it holds NUL bytes (the first at byte 1) and looks like
    UTF-16 little-endian text; save it as UTF-8
"""

from __future__ import annotations

import codecs
import os
import stat

from workbench.core.display import inert
from workbench.core.errors import WorkbenchError

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"),
          (stat.S_ISSOCK, "a socket"))

_BOMS = ((codecs.BOM_UTF32_LE, "UTF-32 little-endian"),
         (codecs.BOM_UTF32_BE, "UTF-32 big-endian"),
         (codecs.BOM_UTF16_LE, "UTF-16 little-endian"),
         (codecs.BOM_UTF16_BE, "UTF-16 big-endian"))
"""Byte-order marks of encodings that are not UTF-8 (UTF-32's first: it starts like UTF-16's)."""


def size_text(n_bytes: int) -> str:
    """``16 MiB``, ``512 KiB`` or ``100 bytes``."""
    for shift, unit in ((20, "MiB"), (10, "KiB")):
        if n_bytes >= 1 << shift and n_bytes % (1 << shift) == 0:
            return f"{n_bytes >> shift} {unit}"
    return f"{n_bytes} bytes"


def read_file(path: str | os.PathLike[str], *, what: str, limit: int) -> bytes:
    """The bytes of the regular file ``path``, refused if larger than ``limit``.

    Args:
        path: the file; symlinks are followed (to a regular file only).
        what: what the file is, for messages (``"prompt file"``).
        limit: the most bytes accepted.

    Returns:
        The whole file.

    Raises:
        WorkbenchError: it cannot be opened, is not a regular file (a directory, a device,
            a FIFO, a socket), or is larger than ``limit``; one line naming the file.
    """
    name = inert(os.fsdecode(path))
    try:
        # O_NONBLOCK: opening a FIFO without a writer returns instead of waiting forever
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise WorkbenchError(f"cannot read {what} {name}: {reason}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = next((k for test, k in _KINDS if test(mode)), "not a file")
            raise WorkbenchError(f"cannot read {what} {name}: it is {kind}, not a regular file")
    except BaseException:
        os.close(fd)
        raise
    with os.fdopen(fd, "rb") as fh:
        try:
            data = fh.read(limit + 1)  # a file that grows while read is still cut off here
        except OSError as exc:
            raise WorkbenchError(f"cannot read {what} {name}: {exc.strerror}") from None
    if len(data) > limit:
        raise WorkbenchError(f"{what} {name} is larger than {size_text(limit)}")
    return data


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
    """:func:`read_file` then :func:`decode_text`: the UTF-8 text of a regular file of at
    most ``limit`` bytes, or one :class:`WorkbenchError` line naming the file."""
    return decode_text(read_file(path, what=what, limit=limit),
                       what=f"{what} {inert(os.fsdecode(path))}")


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
