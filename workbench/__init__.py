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
    "check_device": "workbench.core.devices",
    "load_model": "workbench.models.load",
    "Model": "workbench.models.base",
    "Prompt": "workbench.inputs.prompts",
    "load_prompt_set": "workbench.inputs.prompts",
    "record": "workbench.recording.record",
    "Recording": "workbench.recording.record",
    "RunStore": "workbench.store.runs",
    "run_experiment": "workbench.harness.experiment",
    "WorkbenchError": "workbench.core.errors",
}
# Modules reachable as ``from workbench import hooks`` (the README's tour uses these).
_MODULES = {
    "hooks": "workbench.recording.hooks",
}

# Handing out runs wires in what their notebook cards read from above the store.
_WIRED = {"RunStore": "workbench.harness.display", "run_experiment": "workbench.harness.display"}

__all__ = sorted(_API)


def __getattr__(name: str) -> Any:
    if name in _API:
        if name in _WIRED:
            import_module(_WIRED[name])
        return getattr(import_module(_API[name]), name)
    if name in _MODULES:
        return import_module(_MODULES[name])
    raise AttributeError(f"module 'workbench' has no attribute '{name}'")
