"""Checks on what the store reads back: paths stay inside their folder, ``run.json`` has
the shape the readers rely on.

Every path taken from a stored file (a table's ``file`` in ``run.json``, a data file in a
recording's ``index.json``, a file a checkpoint lists) goes through :func:`confined_file`:
it must name a regular file inside the folder that holds it, after resolving symlinks.
``/dev/zero``, ``/etc/hostname``, ``../other-run/x.parquet`` or a symlink leading out are
refused before anything is read.

:func:`run_meta_problem` says what is wrong with a parsed ``run.json`` (``None`` if
nothing); the store then lists that run as ``damaged`` with the reason instead of failing.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Any, get_args

from workbench.core.errors import ChecksumError, WorkbenchError
from workbench.core.options import Status

SHA256 = re.compile(r"^[0-9a-f]{64}$")
STATUSES: tuple[str, ...] = get_args(Status)


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
    """The regular file that ``rel`` names inside folder ``root``, with symlinks resolved.

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


# key: (types allowed, required); ``None`` in the types allows JSON null
_RUN_KEYS: dict[str, tuple[tuple[type | None, ...], bool]] = {
    "run_id": ((str,), True),
    "experiment": ((str,), True),
    "status": ((str,), True),
    "started_at": ((str,), True),
    "config": ((dict,), True),
    "model": ((dict, None), True),
    "tables": ((dict,), False),  # runs that save no table (recordings) may lack it
    "ended_at": ((str,), False),
    "error": ((str,), False),
    "traceback": ((str,), False),
    "summary": ((list,), False),
    "interventions": ((dict, None), False),
    "git": ((dict, None), False),
    "workbench_version": ((str, None), False),
    "pid": ((int, None), False),
}


def _type_name(types: tuple[type | None, ...]) -> str:
    names = {str: "a string", dict: "an object", list: "a list", int: "an integer", None: "null"}
    return " or ".join(names.get(t, str(t)) for t in types)


def _is(value: Any, types: tuple[type | None, ...]) -> bool:
    if value is None:
        return None in types
    if isinstance(value, bool):  # JSON true is not an integer
        return False
    return any(t is not None and isinstance(value, t) for t in types)


def run_meta_problem(meta: Any, folder: Path) -> str | None:
    """What is wrong with a parsed ``run.json`` read from run folder ``folder`` (``None``
    if nothing): its shape, the types the readers rely on, the run id matching the folder
    name, a known status, and every table entry ``{file, rows, sha256}`` with a file inside
    the folder."""
    if not isinstance(meta, dict):
        return f"run.json holds {type(meta).__name__}, expected an object"
    for key, (types, required) in _RUN_KEYS.items():
        if key not in meta:
            if required:
                return f"run.json has no '{key}'"
            continue
        if not _is(meta[key], types):
            return (f"run.json '{key}' is {type(meta[key]).__name__}, "
                    f"expected {_type_name(types)}")
    if meta["run_id"] != folder.name:
        return f"run.json run_id {meta['run_id']!r} does not match its folder {folder.name!r}"
    if meta["status"] not in STATUSES:
        return f"run.json status {meta['status']!r} is not one of {', '.join(STATUSES)}"
    model = meta["model"]
    if model is not None and not isinstance(model.get("name"), str):
        return "run.json model has no 'name' string"
    if not all(isinstance(line, str) for line in meta.get("summary", [])):
        return "run.json summary is not a list of strings"
    for name, entry in meta.get("tables", {}).items():
        if (problem := _table_problem(entry, folder)) is not None:
            return f"run.json table '{name}': {problem}"
    return None


def _table_problem(entry: Any, folder: Path) -> str | None:
    if not isinstance(entry, dict):
        return "expected an object {file, rows, sha256}"
    if not isinstance(entry.get("file"), str):
        return "no 'file' string"
    if (problem := inside(folder, entry["file"])) is not None:
        return problem
    rows = entry.get("rows")
    if not isinstance(rows, int) or isinstance(rows, bool) or rows < 0:
        return "no 'rows' count"
    sha = entry.get("sha256")
    if not isinstance(sha, str) or not SHA256.match(sha):
        return "no 'sha256' of 64 hex digits"
    return None
