"""A stored run as a notebook shows it (``Run._repr_html_``): its id, experiment, model,
status (with why a run failed or what is damaged), its config with the values off the
experiment's defaults marked, its tables (rows, columns and what each holds), a
``reproduce`` run's verdicts, and a link to the run's dashboard page when one is serving
(:func:`workbench.figures.html.dashboard_url`).

The experiments' defaults and table declarations live above the store; the harness hands
them down through :func:`teach` (``workbench.harness.display`` does, and ``import
workbench`` wires it in before a run or a store is handed out). Without them a run still
shows, its defaults unmarked and its tables' meanings left out.

Examples:
    >>> run = workbench.RunStore("data/runs").latest()      # doctest: +SKIP
    >>> run                                                  # doctest: +SKIP
    (in Jupyter: the run's card)
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow
import pyarrow.parquet as pq

from workbench.core.errors import WorkbenchError
from workbench.figures import html, pages

if TYPE_CHECKING:
    from workbench.store.runs import Run

VALUE_CHARS = 80
"""A config value longer than this is cut (with ``…``) in the card."""
MAX_ROWS = 40
"""Rows of a ``reproduce`` run's verdicts shown."""


def _none(_: str) -> None:
    return None


@dataclass
class Knowledge:
    """What the layers above the store know about a run kind: its default config as
    ``run.json`` holds it, and its declared tables (``{name: Table}``); ``None`` for a
    kind they do not know."""

    defaults: Callable[[str], dict[str, Any] | None] = _none
    tables: Callable[[str], Mapping[str, Any] | None] = _none


KNOWN = Knowledge()


def teach(*, defaults: Callable[[str], dict[str, Any] | None],
          tables: Callable[[str], Mapping[str, Any] | None]) -> None:
    """Hand down where a run kind's defaults and table declarations are read."""
    KNOWN.defaults, KNOWN.tables = defaults, tables


def _value(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
    return text if len(text) <= VALUE_CHARS else text[:VALUE_CHARS - 1] + "…"


def config_rows(run: Run) -> list[list[Any]]:
    """``[key, value, default]`` of the run's config, a value off its default marked."""
    default = KNOWN.defaults(run.experiment) or {}
    missing = object()
    rows = []
    for key, value in run.config.items():
        was = default.get(key, missing)
        shown: Any = _value(value)
        if was is not missing and was != value:
            shown = html.marked(shown, "off the experiment's default")
        rows.append([key, shown, "" if was is missing else _value(was)])
    return rows


def _columns(run: Run, name: str) -> str:
    """A stored table's columns, read from its Parquet footer (the rows are not read)."""
    try:
        return ", ".join(pq.read_schema(run._file(name)).names)
    except (OSError, ValueError, WorkbenchError, pyarrow.ArrowException):
        return "(unreadable)"


def table_rows(run: Run, link: str | None) -> list[list[Any]]:
    """``[name, rows, columns, meaning]`` of every stored table."""
    declared = KNOWN.tables(run.experiment) or {}
    rows = []
    for name in run.table_names():
        table = declared.get(name)
        meaning = getattr(table, "meaning", "") if table is not None else ""
        shown: Any = html.link(link, name) if link else name
        rows.append([shown, run.meta.tables[name].rows, _columns(run, name), meaning])
    return rows


def problems(run: Run) -> list[html.Safe]:
    """What is wrong with the run: why it failed or was interrupted, what is damaged
    (``run.json`` itself, or a table that fails its SHA-256)."""
    found = []
    if run.status in ("failed", "interrupted", "damaged"):
        found.append(html.problem(f"{run.status}: {run.meta.error or 'no reason recorded'}"))
    if run.status != "damaged":
        try:
            run.verify()
        except WorkbenchError as exc:
            found.append(html.problem(f"damaged: {exc}"))
    return found


def verdicts(run: Run) -> html.Safe | None:
    """A ``reproduce`` run's verdicts (``None`` for any other run, or an unreadable
    table)."""
    if run.experiment != "reproduce" or "claims" not in run.meta.tables:
        return None
    with contextlib.suppress(WorkbenchError):
        table = run.table("claims")
        rows = [[r.claim, r.model, html.code(r.verdict), r.measured or r.reason]
                for r in table.head(MAX_ROWS).itertuples()]
        more = f" (first {MAX_ROWS} of {len(table)})" if len(table) > MAX_ROWS else ""
        return html.Safe(f"<div><b>verdicts</b>{more}</div>"
                         + html.rows_table(["claim", "model", "verdict", "measured"], rows))
    return None


def run_html(run: Run) -> str:
    """The run's card (see the module docstring)."""
    base = html.dashboard_url()
    link = pages.run_link(base, run.id, run.experiment) if base else None
    model = run.model_name or "no model"
    title = html.Safe(f"<b>Run</b> {html.code(run.id)} · {html.cell(run.experiment)} · "
                      f"{html.cell(model)} · {html.code(run.status)}"
                      + (f" · {html.link(link, 'open in the dashboard')}" if link else ""))
    parts: list[html.Safe | str] = [*problems(run)]
    if run.seconds is not None:
        parts.append(f"started {run.meta.started_at}, took {run.seconds:.0f} s")
    parts += [html.Safe(f'<div style="color:#334155">{html.cell(line)}</div>')
              for line in run.meta.summary]
    if run.config:
        parts.append(html.Safe("<div><b>config</b> (values off the defaults in amber)</div>"
                               + html.rows_table(["key", "value", "default"],
                                                 config_rows(run))))
    if run.meta.tables:
        parts.append(html.Safe("<div><b>tables</b> (<code>run.table(name)</code>; "
                               "<code>run.figure(name)</code> draws them)</div>"
                               + html.rows_table(["table", "rows", "columns", "meaning"],
                                                 table_rows(run, link))))
    if (shown := verdicts(run)) is not None:
        parts.append(shown)
    if run.meta.recordings:
        names = ", ".join(sorted(run.meta.recordings))
        parts.append(f"recordings: {names} (Recording.open(run.path / name))")
    return html.block(title, *parts)
