"""What produced a run: library versions, the code revision, the machine."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from importlib import metadata
from typing import Any

from workbench.core.paths import REPO_ROOT

PACKAGES = ("interp-workbench", "torch", "transformer-lens", "transformers", "numpy",
            "pandas", "pyarrow", "einops", "dash", "gguf", "safetensors", "tokenizers")


def package_versions() -> dict[str, str | None]:
    """Installed versions of the packages a result depends on (``None`` if missing)."""
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def workbench_version() -> str:
    try:
        return metadata.version("interp-workbench")
    except metadata.PackageNotFoundError:
        return "unknown"


def git_revision() -> dict[str, Any] | None:
    """The checkout's commit and whether it has uncommitted changes, when it is a git repo."""
    if not (REPO_ROOT / ".git").exists():
        return None

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(REPO_ROOT), *args], capture_output=True,
                              text=True, timeout=10).stdout.strip()

    try:
        commit = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": commit or None, "dirty": dirty}


def machine() -> dict[str, Any]:
    import torch

    return {
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "argv": sys.argv,
    }


def load_average() -> list[float] | None:
    """``os.getloadavg()``, or ``None`` on a platform without it (Windows)."""
    try:
        return [round(load, 2) for load in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def _cuda() -> Any:
    """``torch.cuda`` where this process has already started CUDA, else ``None`` (a run
    that never touched a GPU does not import torch or start CUDA for this)."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    return cuda if cuda is not None and cuda.is_initialized() else None


def reset_gpu_peak() -> None:
    """Start counting the peak GPU memory afresh (for the run that begins)."""
    cuda = _cuda()
    if cuda is not None:
        cuda.reset_peak_memory_stats()


def peak_memory() -> dict[str, float | None]:
    """``peak_rss_mib`` (the process's peak resident memory) and ``peak_gpu_mib``
    (``torch.cuda.max_memory_allocated`` since :func:`reset_gpu_peak`; ``None`` without
    CUDA), as ``run.json`` records them."""
    try:
        import resource

        scale = 1 if sys.platform == "darwin" else 1024  # bytes on macOS, KiB on Linux
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / 2**20
    except (ImportError, OSError):
        rss = None
    cuda = _cuda()
    gpu = cuda.max_memory_allocated() / 2**20 if cuda is not None else None
    return {"peak_rss_mib": None if rss is None else round(rss, 1),
            "peak_gpu_mib": None if gpu is None else round(gpu, 1)}


def collect() -> dict[str, Any]:
    """Everything above, as stored in ``run.json``."""
    return {"versions": package_versions(), "git": git_revision(), "machine": machine()}
