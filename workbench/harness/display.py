"""Hands the run store what a run's notebook card needs from the layers above it: each
experiment's default config (:func:`workbench.harness.run_facts.defaults`) and its table
declarations (its ``tables.py``, through the registry). ``import workbench`` imports this
module before it hands out a run or a store, so cards mark the values off the defaults and
say what each table holds.

Examples:
    >>> import workbench.harness.display  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from workbench.core.errors import WorkbenchError
from workbench.harness import experiment, run_facts
from workbench.store import display


def declared_tables(kind: str) -> Mapping[str, Any] | None:
    """The table declarations of a registered experiment; ``None`` for another run kind."""
    try:
        return experiment.get(kind).tables
    except WorkbenchError:
        return None


display.teach(defaults=run_facts.defaults, tables=declared_tables)
