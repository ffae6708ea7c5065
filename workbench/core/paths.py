"""Where the workbench keeps things: the model cache, the run store and the data folder."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def data_dir() -> Path:
    """Prompt sets, corpora and published claims (``WORKBENCH_DATA_DIR`` or ``<repo>/data``)."""
    return Path(os.environ.get("WORKBENCH_DATA_DIR", REPO_ROOT / "data"))


def cache_dir() -> Path:
    """Fetched model files (``WORKBENCH_CACHE`` or ``~/.cache/workbench``)."""
    default = Path.home() / ".cache" / "workbench"
    return Path(os.environ.get("WORKBENCH_CACHE", default)).expanduser()


def runs_dir(override: str | os.PathLike[str] | None = None) -> Path:
    """The run store: ``override`` (``--out``), else ``WORKBENCH_RUNS_DIR``, else ``data/runs``."""
    if override is not None:
        return Path(override).expanduser()
    env = os.environ.get("WORKBENCH_RUNS_DIR")
    return Path(env).expanduser() if env else data_dir() / "runs"
