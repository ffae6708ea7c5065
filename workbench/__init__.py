"""A workbench for mechanistic interpretability of transformer attention.

The public API, imported lazily so that ``workbench --help`` stays fast:

    >>> import workbench
    >>> model = workbench.load_model("smollm2")                        # doctest: +SKIP
    >>> run = workbench.run_experiment("head-overview", model)         # doctest: +SKIP
    >>> rec = workbench.Recording.open(run_dir)                        # doctest: +SKIP
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

__version__ = "0.1.0"

_API = {
    "load_model": "workbench.models",
    "Model": "workbench.models",
    "Prompt": "workbench.prompts",
    "load_prompt_set": "workbench.prompts",
    "record": "workbench.recording",
    "Recording": "workbench.recording",
    "RunStore": "workbench.runs",
    "run_experiment": "workbench.experiment",
    "WorkbenchError": "workbench.errors",
}

__all__ = sorted(_API)


def __getattr__(name: str) -> Any:
    if name in _API:
        return getattr(import_module(_API[name]), name)
    raise AttributeError(f"module 'workbench' has no attribute '{name}'")
