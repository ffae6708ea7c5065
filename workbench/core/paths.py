"""Where the workbench keeps things: the model cache, the run store and the data folder."""

from __future__ import annotations

import os
from pathlib import Path

from workbench.core.errors import WorkbenchError

REPO_ROOT = Path(__file__).resolve().parents[2]


def _env_path(name: str) -> Path | None:
    """The folder an environment variable names (``None``: it is not set).

    Raises:
        WorkbenchError: it is set but empty, which would otherwise mean the current folder
            or the default without a word.
    """
    value = os.environ.get(name)
    if value is None:
        return None
    if not value.strip():
        raise WorkbenchError(f"{name} is set but empty; name a folder, or unset it for the "
                             "default")
    return Path(value).expanduser()


def data_dir() -> Path:
    """Prompt sets, corpora and published claims (``WORKBENCH_DATA_DIR`` or ``<repo>/data``)."""
    return _env_path("WORKBENCH_DATA_DIR") or REPO_ROOT / "data"


def cache_dir() -> Path:
    """Fetched model files (``WORKBENCH_CACHE`` or ``~/.cache/workbench``)."""
    return _env_path("WORKBENCH_CACHE") or Path.home() / ".cache" / "workbench"


def runs_dir(override: str | os.PathLike[str] | None = None) -> Path:
    """The run store: ``override`` (``--out``), else ``WORKBENCH_RUNS_DIR``, else ``data/runs``."""
    if override is not None:
        return Path(override).expanduser()
    return _env_path("WORKBENCH_RUNS_DIR") or data_dir() / "runs"


def check_store(root: Path, *, write: bool, origin: str | None = None) -> None:
    """Refuse a run store that is not a folder, or (``write``) one this process cannot
    write, before anything else happens (before a model loads).

    Args:
        root: the run store (it need not exist yet: its nearest existing folder is checked).
        write: whether the caller writes runs.
        origin: where the choice came from (``--out``, ``WORKBENCH_RUNS_DIR``), for the
            message.

    Raises:
        WorkbenchError: the store or a folder above it is a file, or it cannot be written.
    """
    said = f" ({origin})" if origin else ""
    existing = next(p for p in (root, *root.parents) if p.exists())
    if not existing.is_dir():
        where = "" if existing == root else f": {existing} is a file"
        raise WorkbenchError(f"the run store {root}{said} is not a folder{where}")
    if not write:
        return
    if os.statvfs(existing).f_flag & os.ST_RDONLY:
        raise WorkbenchError(f"cannot write the run store {root}{said}: {existing} is on a "
                             "read-only file system")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise WorkbenchError(f"cannot write the run store {root}{said}: no permission to "
                             f"write in {existing}")
