"""SHA-256 checksums, with a stamp so unchanged large files are not hashed on every load.

A manifest maps file names to ``{"sha256", "size", "mtime_ns"}``. :func:`verify` trusts a
file whose size and modification time still match its stamp (as ``git`` does with its
index) and hashes it again otherwise, so an edited or truncated file is always caught.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from workbench.core.errors import ChecksumError

_CHUNK = 1 << 20


def sha256_file(path: str | os.PathLike[str]) -> str:
    """Hex SHA-256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def stamp(path: Path, sha256: str) -> dict[str, Any]:
    """The manifest entry for ``path`` whose hash is already known to be ``sha256``."""
    st = path.stat()
    return {"sha256": sha256, "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def verify(path: Path, entry: dict[str, Any], *, hint: str = "") -> None:
    """Check ``path`` against its manifest entry.

    Raises:
        ChecksumError: the file is missing, unreadable, or its hash differs.
    """
    try:
        st = path.stat()
    except OSError as exc:
        raise ChecksumError(f"cannot read {path}: {exc.strerror}{hint}") from None
    if st.st_size == entry["size"] and st.st_mtime_ns == entry["mtime_ns"]:
        return
    actual = sha256_file(path)
    if actual != entry["sha256"]:
        raise ChecksumError(
            f"checksum mismatch for {path}: expected sha256 {entry['sha256'][:16]}…, "
            f"got {actual[:16]}…{hint}"
        )


def write_json_atomic(path: Path, payload: Any) -> None:
    """Write JSON to a temporary sibling, flush it to disk, then rename over ``path``."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as fh:
        json.dump(payload, fh, indent=2, sort_keys=True, default=str)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
