"""What tells stored runs apart: the config values a run changed from its experiment's
defaults, the sweep it was a cell of, and its wall time with the machine's load.

``workbench runs``, the Runs page and every page's run dropdown show these, so six cells
of one sweep no longer list as six identical rows.

Examples:
    >>> from workbench.store.runs import RunStore
    >>> store = RunStore("data/runs")                                # doctest: +SKIP
    >>> [varies_text(run) for run in store.runs()]                   # doctest: +SKIP
    ['-', 'n_boot=50', 'seed=2, n_prompts=64']
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from functools import cache
from typing import Any

from workbench.core.errors import WorkbenchError
from workbench.store.runs import Run

VALUE_CHARS = 32
"""A value longer than this is shortened (with ``…``) in a ``varies`` cell."""


def stored_form(cfg: Any) -> dict[str, Any]:
    """A config dataclass as ``run.json`` holds it (tuples as lists)."""
    return json.loads(json.dumps(dataclasses.asdict(cfg), default=str))


@cache
def defaults(experiment: str) -> dict[str, Any] | None:
    """The default config of a registered experiment as ``run.json`` holds it (tuples as
    lists); ``None`` for another run kind (``record``, ``sweep``, ``reproduce``) or a name
    no experiment has any more."""
    from workbench.harness.experiment import get

    try:
        cfg = get(experiment).config()
    except WorkbenchError:
        return None
    return stored_form(cfg)


def varies(run: Run) -> dict[str, Any]:
    """The config keys whose values differ from the experiment's defaults, with the run's
    values, in the config's order (empty for a default run or another run kind)."""
    default = defaults(run.experiment)
    if default is None:
        return {}
    missing = object()
    return {k: v for k, v in run.config.items() if default.get(k, missing) != v}


def _value(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
    return text if len(text) <= VALUE_CHARS else text[:VALUE_CHARS - 1] + "…"


def varies_text(run: Run) -> str:
    """:func:`varies` as ``key=value, key=value`` (``-`` for none)."""
    changed = varies(run)
    return ", ".join(f"{k}={_value(v)}" for k, v in changed.items()) or "-"


def sweep_name(run: Run) -> str | None:
    """The spec's name of a sweep run (``None`` for any other run)."""
    name = run.config.get("name") if run.experiment == "sweep" else None
    return name if isinstance(name, str) and name else None


def parents(runs: Sequence[Run]) -> dict[str, Run]:
    """The sweep each run of ``runs`` was a cell of, by the cell's run id (a sweep's
    ``run.json`` lists its cells); runs of no sweep are absent."""
    found: dict[str, Run] = {}
    for run in runs:
        if run.experiment == "sweep" and run.status != "damaged":
            for cell in run.meta.cells or ():
                if cell:
                    found[cell] = run
    return found


def parent_text(run: Run, sweeps: dict[str, Run]) -> str:
    """The sweep a run was a cell of, as ``<spec name> (<id's last 4>)``; ``-`` for none."""
    parent = sweeps.get(run.id)
    if parent is None:
        return "-"
    return f"{sweep_name(parent) or 'sweep'} ({parent.id[-4:]})"


def duration_text(seconds: float | None) -> str:
    """A wall time as the CLI and the pages print one (``under 1 s``, ``42 s``,
    ``3 min 05 s``; ``-`` for a run that has not ended)."""
    if seconds is None:
        return "-"
    if seconds < 1:  # run.json keeps whole seconds
        return "under 1 s"
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest:02d} s"


def load_text(run: Run) -> str:
    """``busy``, ``idle`` or ``-`` (not recorded): whether the machine's load was above its
    cores at the run's start or end (:attr:`workbench.store.records.RunMeta.busy`)."""
    if run.status == "damaged":
        return "-"
    busy = run.meta.busy
    return "-" if busy is None else ("busy" if busy else "idle")
