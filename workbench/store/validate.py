"""Checks on what the store reads back: paths stay inside their folder.

Every path taken from a stored file (a table's ``file`` in ``run.json``, a data file in a
recording's ``index.json``, a file a checkpoint lists) goes through :func:`confined_file`:
it must name a regular file inside the folder that holds it, after resolving symlinks.
``/dev/zero``, ``/etc/hostname``, ``../other-run/x.parquet`` or a symlink leading out are
refused before anything is read.

The shape of every stored file is its record type's (:mod:`workbench.core.records`).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from workbench.core.errors import ChecksumError, WorkbenchError


def real(path: str | os.PathLike[str]) -> Path:
    """``path`` with every symlink resolved; never raises (a symlink loop resolves to a
    path that then fails to open, where ``Path.resolve`` would raise ``RuntimeError``)."""
    return Path(os.path.realpath(path))


def inside(root: Path, rel: Any) -> str | None:
    """What is wrong with ``rel`` as a path relative to ``root``, judged by its text alone
    (``None`` if nothing): not a string, empty, absolute, or climbing out with ``..``."""
    if not isinstance(rel, str) or not rel or "\0" in rel:
        return f"{rel!r} is not a file name"
    if os.path.isabs(rel) or Path(rel).drive:
        return f"{rel!r} is an absolute path; expected a path inside {root}"
    normal = os.path.normpath(rel)
    if normal == os.curdir or normal == os.pardir or normal.startswith(os.pardir + os.sep):
        return f"{rel!r} points outside {root}"
    return None


def confined_file(root: str | os.PathLike[str], rel: Any, *, what: str) -> Path:
    """The regular file that ``rel`` names inside folder ``root``, with symlinks resolved
    (a plain file name that is a regular file in ``root`` is returned as ``root / rel``).

    Args:
        root: the folder the path must stay in (a run folder, a recording folder).
        rel: the path as read from a stored file.
        what: the file that named it, for the message (e.g. ``run.json table 'x'``).

    Raises:
        WorkbenchError: ``rel`` is not a relative path, leads outside ``root`` (also through
            a symlink), or names something that is not a regular file (a device, a folder).
        ChecksumError: the file is missing.
    """
    root = Path(root)
    if (problem := inside(root, rel)) is not None:
        raise WorkbenchError(f"{what}: {problem}")
    if os.sep not in rel and (os.altsep is None or os.altsep not in rel):
        # a plain name that is a regular file, not a symlink, lies directly in the folder,
        # wherever the folder itself resolves to: nothing to resolve (a store lists
        # thousands of run.json files this way)
        try:
            if stat.S_ISREG(os.lstat(root / rel).st_mode):
                return root / rel
        except OSError:
            pass  # said below, with the full check's message
    base = real(root)
    path = real(base / rel)
    if path == base or not path.is_relative_to(base):
        raise WorkbenchError(f"{what}: {rel!r} leads outside {root} (through a symlink)")
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise ChecksumError(f"{what}: {root / rel} is missing") from None
    except OSError as exc:
        raise WorkbenchError(f"{what}: cannot read {root / rel} ({exc.strerror})") from None
    if not stat.S_ISREG(mode):
        raise WorkbenchError(f"{what}: {root / rel} is not a regular file")
    return path
