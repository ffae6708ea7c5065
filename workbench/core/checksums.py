"""SHA-256 checksums, with a stamp so unchanged large files are not hashed on every load.

A manifest maps file names to a :class:`FileStamp`: the file's SHA-256 and the facts of
its status when it was hashed (``size``, ``mtime_ns``, ``ctime_ns``, ``inode``).
:func:`verify` trusts a file only while all four of its stamp's facts still hold, and
hashes it again otherwise. Size and modification time alone are not enough: ``touch -d``
sets the modification time back after an edit of the same length. The status-change time
(``ctime``) cannot be set back that way (any write, ``touch`` or ``chmod`` moves it to the
present), and the inode changes when a file is replaced by another. A stamp written before
ctime and inode were kept (size and mtime only) still reads, and is never trusted: the
file is hashed.

File times tick with a coarse kernel clock, so a write in the same tick as the stamp's
could keep the ctime the stamp saw (git's "racily clean" problem). A stamp therefore also
keeps when it was taken (``stamped_ns``), and is trusted only if the file's ctime was at
least :data:`RACY_NS` older than that; a fresh file is hashed again until it is.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat as stat_mode
import time
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field

from workbench.core import durable
from workbench.core.errors import ChecksumError
from workbench.core.records import Count, Hex64, Record

_CHUNK = 1 << 20
STAMP_KEYS = ("size", "mtime_ns", "ctime_ns", "inode")
"""The facts of a file's status that must all be unchanged for its stamp to be trusted."""
RACY_NS = 1_000_000_000
"""How much older than its stamp a file's ctime must be for the stamp to be trusted."""

Nanoseconds = Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]
"""A file time in nanoseconds since the epoch (before 1970 it is negative)."""
Inode = Annotated[int, Field(ge=0, le=2**64 - 1)]


class FileStamp(Record):
    """A file's SHA-256 and the status it had when hashed: one entry of a manifest.

    Only ``sha256`` is required: a stamp lacking any status fact (written before it was
    kept, or not stamped yet) is valid and never trusted.
    """

    sha256: Hex64
    size: Count | None = None
    mtime_ns: Nanoseconds | None = None
    ctime_ns: Nanoseconds | None = None
    inode: Inode | None = None
    stamped_ns: Nanoseconds | None = None
    """When the stamp was taken (:data:`RACY_NS`)."""


def sha256_file(path: str | os.PathLike[str]) -> str:
    """Hex SHA-256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _facts(st: os.stat_result) -> dict[str, int]:
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns,
            "inode": st.st_ino}


def stamp(path: Path, sha256: str) -> FileStamp:
    """The manifest entry for ``path`` whose hash is already known to be ``sha256``.

    Take it once the file is written for good (after its last write and ``fsync``):
    anything that touches the file later makes :func:`verify` hash it again.
    """
    stamped = time.time_ns()
    return FileStamp(sha256=sha256, **_facts(path.stat()), stamped_ns=stamped)


def unchanged(path: Path, entry: FileStamp) -> bool:
    """Whether ``path`` is a regular file whose status still matches every stamp fact, and
    the stamp was taken long enough after the file's last change to be trusted."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    facts = _facts(st)
    settled = entry.stamped_ns is not None and entry.stamped_ns - facts["ctime_ns"] >= RACY_NS
    return stat_mode.S_ISREG(st.st_mode) and settled and all(
        getattr(entry, k) == facts[k] for k in STAMP_KEYS)


def verify(path: Path, entry: FileStamp, *, hint: str = "",
           rehash: bool = False) -> FileStamp | None:
    """Check ``path`` against its manifest entry.

    The file is hashed unless its stamp still holds (see the module docstring); with
    ``rehash`` it is always hashed. Only regular files pass: a symlink, a folder or a
    device (``/dev/zero``) is refused without being read.

    Args:
        hint: appended to an error message (what to do about it).
        rehash: hash the file even if its stamp holds.

    Returns:
        A fresh stamp when the file was hashed, found intact, and did not change while it
        was hashed (to store in place of ``entry``); ``None`` when the stamp was trusted.

    Raises:
        ChecksumError: the file is missing, not a regular file, unreadable, or its hash
            differs.
    """
    try:
        before = os.lstat(path)
    except OSError as exc:
        raise ChecksumError(f"cannot read {path}: {exc.strerror}{hint}") from None
    if not stat_mode.S_ISREG(before.st_mode):
        raise ChecksumError(f"{path} is not a regular file{hint}")
    if not rehash and unchanged(path, entry):
        return None
    started = time.time_ns()
    try:
        actual = sha256_file(path)
    except OSError as exc:
        raise ChecksumError(f"cannot read {path}: {exc.strerror}{hint}") from None
    if actual != entry.sha256:
        raise ChecksumError(
            f"checksum mismatch for {path}: expected sha256 {entry.sha256[:16]}…, "
            f"got {actual[:16]}…{hint}"
        )
    try:
        same = _facts(os.lstat(path)) == _facts(before)
    except OSError:
        same = False
    return FileStamp(sha256=actual, **_facts(before), stamped_ns=started) if same else None


def write_json_atomic(path: Path, payload: Any) -> None:
    """Write JSON through a flushed temporary sibling renamed over ``path``
    (:func:`workbench.core.durable.write_atomic`: no half-written file on a full disk)."""
    text = json.dumps(payload, indent=2, sort_keys=True, default=str) + "\n"
    durable.write_atomic(path, text.encode("utf-8"))


def write_record_atomic(path: Path, record: Record) -> None:
    """Write a record as its file, the same way as :func:`write_json_atomic`."""
    durable.write_atomic(path, record.to_json())


def sources_key(*folders: Path) -> str:
    """A digest of every ``.py`` file under ``folders`` (its path, size and modification
    time), as Python's own bytecode cache tells a changed source: a cache derived from the
    code (the store's index, the experiments' defaults) is rebuilt when it changes."""
    digest = hashlib.blake2b(digest_size=16)
    for top in folders:
        for folder, dirs, files in os.walk(top):
            dirs.sort()
            for name in sorted(files):
                if name.endswith(".py"):
                    st = os.stat(os.path.join(folder, name))
                    digest.update(f"{folder}/{name}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()
