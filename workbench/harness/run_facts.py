"""What tells stored runs apart: a run's interventions and the config values it changed from
its experiment's defaults, the sweep it was a cell of, and its wall time with the machine's
load.

``workbench runs``, the Runs page and every page's run dropdown show these, so six cells
of one sweep no longer list as six identical rows.

Examples:
    >>> from workbench.store.runs import RunStore
    >>> store = RunStore("data/runs")                                # doctest: +SKIP
    >>> [varies_text(run) for run in store.runs()]                   # doctest: +SKIP
    ['-', 'n_boot=50', 'seed=2, n_prompts=64', '9 heads mean-ablated (L17H3, L17H4, L18H6, ...)']
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import logging
import os
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field

from workbench.core import durable, paths
from workbench.core.checksums import sources_key
from workbench.core.errors import UnknownNameError, WorkbenchError
from workbench.core.files import read_bounded
from workbench.core.records import Json, Record, RecordError
from workbench.core.registry import did_you_mean
from workbench.harness.config import EXTRA_EXPERIMENTS
from workbench.store.runs import Run

log = logging.getLogger(__name__)

VALUE_CHARS = 32
"""A value longer than this is shortened (with ``…``) in a ``varies`` cell."""


def stored_form(cfg: Any) -> dict[str, Any]:
    """A config dataclass as ``run.json`` holds it (tuples as lists)."""
    return json.loads(json.dumps(dataclasses.asdict(cfg), default=str))


KINDS_CACHE = "run-kinds.json"
"""The file of the cache folder (:func:`workbench.core.paths.cache_dir`) that keeps
:func:`run_kinds` for the code that wrote it."""


class _Kinds(Record):
    code: Annotated[str, Field(max_length=64)]
    kinds: dict[Annotated[str, Field(max_length=200)], dict[str, Json] | None]


def _code_key() -> str | None:
    """The sources key of the workbench and experiments packages (``None``: run kinds are
    also imported from ``WORKBENCH_EXPERIMENTS``, whose sources are not followed)."""
    spec = importlib.util.find_spec("experiments")  # found, not imported
    if os.environ.get(EXTRA_EXPERIMENTS, "").strip() or spec is None \
            or not spec.submodule_search_locations:
        return None
    return sources_key(Path(__file__).resolve().parents[1],
                       *map(Path, spec.submodule_search_locations))


def _imported_kinds() -> dict[str, dict[str, Any] | None]:
    from workbench.harness.experiment import OTHER_RUN_KINDS, all_experiments

    return {**{exp.name: stored_form(exp.config()) for exp in all_experiments()},
            **dict.fromkeys(OTHER_RUN_KINDS)}


@cache
def run_kinds() -> dict[str, dict[str, Any] | None]:
    """Every run kind by name: an experiment's default config as ``run.json`` holds it
    (tuples as lists), ``None`` for the other kinds (``record``, ``reproduce``, ``sweep``).

    Read from the cache when the same code wrote it (the sources of the workbench and
    experiments packages unchanged: :func:`workbench.core.checksums.sources_key`), else
    from the experiments, imported (with torch), and cached: a process that only lists
    runs (``workbench runs``) imports no experiment. Modules named in
    ``WORKBENCH_EXPERIMENTS`` are always imported."""
    key = _code_key()
    path = paths.cache_dir() / KINDS_CACHE
    if key is not None and path.is_file():
        try:
            cached = _Kinds.from_json(read_bounded(path, 16 << 20, what=KINDS_CACHE),
                                      what=str(path))
        except (WorkbenchError, RecordError) as exc:
            log.info("not using %s: %s", path, str(exc).splitlines()[0])
        else:
            if cached.code == key:
                return cached.kinds
    kinds = _imported_kinds()
    if key is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            durable.write_atomic(path, _Kinds(code=key, kinds=kinds).to_json())
        except (OSError, RecordError) as exc:  # a read-only home: imported next time too
            log.info("cannot cache the run kinds in %s: %s", path, exc)
    return kinds


def defaults(experiment: str) -> dict[str, Any] | None:
    """The default config of a registered experiment as ``run.json`` holds it (tuples as
    lists); ``None`` for another run kind (``record``, ``sweep``, ``reproduce``) or a name
    no experiment has any more."""
    return run_kinds().get(experiment)


def check_run_kind(name: str) -> None:
    """Raise :class:`UnknownNameError` unless ``name`` is an experiment or another run kind
    (the message lists them and suggests the closest)."""
    known = sorted(run_kinds())
    if name not in known:
        raise UnknownNameError(f"unknown experiment '{name}'{did_you_mean(name, known)}; "
                               f"runs are of: {', '.join(known)}")


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
    """What tells a run apart from a default run of its kind: its interventions in a few
    words (:func:`workbench.store.records.interventions_text`), then :func:`varies` as
    ``key=value, key=value`` (``-`` for neither)."""
    changed = varies(run)
    parts = [run.interventions_text, *(f"{k}={_value(v)}" for k, v in changed.items())]
    return ", ".join(part for part in parts if part) or "-"


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
            for cell in run.cells or ():
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
    busy = run.busy
    return "-" if busy is None else ("busy" if busy else "idle")
