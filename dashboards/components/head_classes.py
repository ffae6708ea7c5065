"""A run's head classes on its layer x head heatmap, at a false-discovery rate the reader
chooses.

A run of previous-token-heads, induction-heads, head-overview or attention-sinks stores a
``head_classes`` table (:mod:`workbench.scores.classes`): each head's BH q-value for each
class. A page built on a heatmap of head scores adds :func:`controls` (a class and a rate),
calls :func:`follow` once at import, and :func:`mark` when it draws: the heads in the class
at that rate (``q <= rate``, read by :func:`workbench.scores.classes.at_rate`, as
``workbench show RUN --classes --fdr RATE`` reads them) get an outlined square with their q
on hover, and a line says how many, in the words of
:func:`workbench.scores.classes.summary_line`.
"""

from __future__ import annotations

from typing import Annotated

import pandas as pd
import plotly.graph_objects as go
from dash import Input, Output, State, callback, dcc, html

from dashboards.components import data
from dashboards.components.controls import labelled
from dashboards.components.messages import safe
from dashboards.components.values import Name, OneOf, Real, RunId
from workbench.scores import classes
from workbench.store.runs import Run
from workbench.store.schema import head_classes
from workbench.views.heads import outline_heads

TABLE = head_classes().name
"""The table's name, as every experiment that scores heads declares it
(:func:`workbench.store.schema.head_classes`)."""
LOWEST_RATE = 1e-6
"""The smallest rate the input takes: below the smallest p-value any run can report (one
in 1 + n_draws), so a smaller rate could only ever mark nothing."""
ClassName = Annotated[str | None, OneOf(tuple(classes.CLASSES.names()))]
Rate = Annotated[float | None, Real(LOWEST_RATE, 1)]


def controls(page: str) -> list:
    """The class dropdown and the rate input, ids ``{page}-class`` and ``{page}-fdr``,
    each with the box that says why it could not be filled (``{page}-class-error``,
    ``{page}-fdr-error``)."""
    return [
        labelled("head class", dcc.Dropdown(id=f"{page}-class", clearable=False,
                                            placeholder="no head classes"), "12em"),
        html.Div(id=f"{page}-class-error"),
        labelled("FDR", dcc.Input(id=f"{page}-fdr", type="number", min=LOWEST_RATE, max=1,
                                  step="any", debounce=True, style={"width": "6em"})),
        html.Div(id=f"{page}-fdr-error"),
    ]


def table_of(run: Run) -> pd.DataFrame | None:
    """The run's ``head_classes`` table, or ``None`` (a run written before classes)."""
    return data.table(run, TABLE) if TABLE in run.table_names() else None


def class_names(table: pd.DataFrame | None) -> list[str]:
    """The classes a ``head_classes`` table holds, in its order."""
    return [] if table is None else list(dict.fromkeys(table.head_class))


def default_class(names: list[str], metric: str | None, current: str | None, *,
                  any_class: bool = True) -> str | None:
    """The class shown for ``metric``: the one that tests it, else (with ``any_class``)
    the one shown before, else the first of ``names``; ``None`` when there is none."""
    matching = [c.name for c in classes.for_metrics([metric] if metric else [])]
    for name in [*matching, current if any_class else None]:
        if name in names:
            return name
    return names[0] if names and any_class else None


def follow(page: str, *, shows: list[str], any_class: bool = True) -> None:
    """Fill ``{page}-class`` with the classes of the run in ``{page}-run`` (following
    ``{page}-metric``), and ``{page}-fdr`` with the run's declared rate.

    Call it once, at the page's import, beside its callbacks.

    Args:
        page: the page's id prefix.
        shows: the run kinds the page shows.
        any_class: when the metric shown tests no class, outline the class shown before
            (or the first); ``False`` outlines none, for a page whose heatmap and outlines
            read as one metric and its class (the Heads page: ``next_token`` outlined with
            the previous-token class read as next-token heads).
    """

    @callback(Output(f"{page}-class", "options"), Output(f"{page}-class", "value"),
              Output(f"{page}-class-error", "children"),
              Input(f"{page}-run", "value"), Input(f"{page}-metric", "value"),
              State(f"{page}-class", "value"))
    @safe
    def choose_class(run_id: RunId, metric: Name, current: ClassName):
        names = class_names(table_of(data.get_run(run_id, shows=shows)))
        return names, default_class(names, metric, current, any_class=any_class), None

    @callback(Output(f"{page}-fdr", "value"), Output(f"{page}-fdr-error", "children"),
              Input(f"{page}-run", "value"))
    @safe
    def stored_rate(run_id: RunId):
        table = table_of(data.get_run(run_id, shows=shows))
        rate = None if table is None or table.empty else float(table.fdr.iloc[0])
        return rate, None


def mark(fig: go.Figure, run: Run, name: str | None, rate: float | None) -> str:
    """Outline on ``fig`` (a layer x head heatmap) the heads of ``run`` in class ``name``
    at false-discovery rate ``rate`` (none: the run's declared rate), and say so.

    Returns:
        One line: how many heads are in the class at the rate, or why none is marked.
    """
    table = table_of(run)
    if table is None:
        return f"run {run.id} has no head_classes table (written before head classes): no " \
               "heads are marked"
    if name is None or name not in class_names(table):
        held = ", ".join(class_names(table)) or "none"
        return f"no head class chosen (the run's classes: {held}): no heads are marked"
    rows = classes.at_rate(table[table.head_class == name], rate)
    outline_heads(fig, rows[rows.in_class], name, float(rows.fdr.iloc[0]))
    return classes.summary_line(rows, name)
