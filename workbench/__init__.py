"""A workbench for mechanistic interpretability of transformer attention.

The public API, imported lazily so that ``workbench --help`` stays fast:

    >>> import workbench
    >>> model = workbench.load_model("smollm2")                        # doctest: +SKIP
    >>> run = workbench.run_experiment("head-overview", model)         # doctest: +SKIP
    >>> workbench.figure(run, "head_scores", metric="induction")       # doctest: +SKIP
    >>> rec = workbench.Recording.open(run_dir)                        # doctest: +SKIP
    >>> workbench.show_pattern(rec, 0, layer=1, head=2)                # doctest: +SKIP
    >>> workbench.static_figures()   # figures also carry PNG and SVG  # doctest: +SKIP

In IPython and Jupyter, ``import workbench`` registers the HTML cards of a run, a
recording and a model (:mod:`workbench.views.cards`) with IPython's display formatters; a
shell started after the import gets them with ``%load_ext workbench``.
"""

from __future__ import annotations

import sys
from importlib import import_module
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_API = {
    "check_device": "workbench.core.devices",
    "load_model": "workbench.models.load",
    "Model": "workbench.models.base",
    "Prompt": "workbench.inputs.prompts",
    "load_prompt_set": "workbench.inputs.prompts",
    "record": "workbench.recording.writer",
    "Recording": "workbench.recording.reader",
    "RunStore": "workbench.store.runs",
    "run_experiment": "workbench.harness.experiment",
    "WorkbenchError": "workbench.core.errors",
    "figure": "workbench.views.catalog",
    "show_pattern": "workbench.views.patterns",
    "show_long": "workbench.views.patterns",
    "static_figures": "workbench.views.static",
}
# Modules reachable as ``from workbench import hooks`` (the five-minute tour uses these).
_MODULES = {
    "hooks": "workbench.recording.hooks",
}
# The types that have a notebook card, by module and name, so that registering a card
# imports none of them (a kernel pays for them only when it shows one).
_CARDS = (("workbench.store.runs", "Run"), ("workbench.recording.reader", "Recording"),
          ("workbench.models.base", "Model"))

__all__ = ["Model", "Prompt", "Recording", "RunStore", "WorkbenchError", "check_device",
           "figure", "load_model", "load_prompt_set", "record", "run_experiment",
           "show_cards", "show_long", "show_pattern", "static_figures"]
"""The names of :data:`_API` and ``show_cards`` (a test keeps them equal)."""

if TYPE_CHECKING:  # what a type checker sees of the names imported on first use
    from workbench.core.devices import check_device
    from workbench.core.errors import WorkbenchError
    from workbench.harness.experiment import run_experiment
    from workbench.inputs.prompts import Prompt, load_prompt_set
    from workbench.models.base import Model
    from workbench.models.load import load_model
    from workbench.recording import hooks as hooks  # a module, not in __all__
    from workbench.recording.reader import Recording
    from workbench.recording.writer import record
    from workbench.store.runs import RunStore
    from workbench.views.catalog import figure
    from workbench.views.patterns import show_long, show_pattern
    from workbench.views.static import static_figures


def __getattr__(name: str) -> Any:
    if name in _API:
        return getattr(import_module(_API[name]), name)
    if name in _MODULES:
        return import_module(_MODULES[name])
    raise AttributeError(f"module 'workbench' has no attribute '{name}'")


def _card(obj: Any) -> str:
    return import_module("workbench.views.cards").card(obj)


def show_cards(shell: Any = None) -> bool:
    """Register the notebook cards of a run, a recording and a model with the HTML
    formatter of ``shell`` (default: the running IPython shell, if any).

    ``import workbench`` calls it; it does nothing, and returns ``False``, outside IPython
    or where IPython is not installed.

    Examples:
        >>> show_cards()          # not in IPython: nothing to register with
        False
    """
    if shell is None:
        ipython = sys.modules.get("IPython")  # never imported here: a script has no shell
        shell = ipython.get_ipython() if ipython is not None else None
    if shell is None:
        return False
    formatter = shell.display_formatter.formatters["text/html"]
    for module, name in _CARDS:
        formatter.for_type_by_name(module, name, _card)
    return True


def load_ipython_extension(shell: Any) -> None:
    """``%load_ext workbench``: the cards for a shell started after ``import workbench``."""
    show_cards(shell)


show_cards()
