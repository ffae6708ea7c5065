"""Sweeps: one metric across every cell of a sweep. A mosaic (a row per cell: its model or
checkpoint and varying config values; a column per head of the layer x head grid, or the
cell's top-k heads; colour the score, the 95% interval on hover); for sweeps over training
checkpoints, the best head's score with its interval against tokens seen, one line per
trained model; click a mosaic cell to open its run.

Everything shown is read from the sweep run's ``scores`` and ``cells`` tables, by their
declarations in :mod:`workbench.harness.sweeps.tables`."""

from __future__ import annotations

from typing import Annotated

import dash
import pandas as pd
from dash import Input, Output, callback, dcc, html, no_update

from dashboards.components import data, exports, links
from dashboards.components.controls import labelled, run_search
from dashboards.components.messages import message, safe, safe_layout
from dashboards.components.skeleton import run_page
from dashboards.components.values import MAX_INDEX, Click, Name, OneOf, RunId, Whole, among
from workbench.harness.sweeps.tables import CELLS, SCORES
from workbench.views import pages
from workbench.views.sweeps import lines_figure, mosaic

SHOWS = pages.shows("/sweeps")
run_search("sweeps-run", SHOWS)
dash.register_page(__name__, path="/sweeps", name="Sweeps",
                   order=pages.order("/sweeps"), experiments=SHOWS)

EMPTY = "No sweeps yet. Run one with `workbench sweep data/sweeps/seeds.toml`."
SEP = "|"
"""Joins an experiment and a metric in the metric dropdown's values."""
MAX_K = 50
Columns = Annotated[str, OneOf(("grid", "top"), optional=False)]
TopK = Annotated[int | None, Whole(1, MAX_K)]


@safe_layout("Sweeps")
def layout(run: str | None = None, **_: str) -> html.Div:
    return run_page("sweeps", "Sweeps", shows=SHOWS, requested=run, empty=EMPTY,
                    run_label="sweep", controls=[
        labelled("metric", dcc.Dropdown(id="sweeps-metric", clearable=False), "22em"),
        labelled("columns", dcc.RadioItems(
            id="sweeps-columns", value="grid", inline=True,
            options=[{"label": "every head (layer x head)", "value": "grid"},
                     {"label": "top-k heads", "value": "top"}])),
        labelled("k", dcc.Input(id="sweeps-k", type="number", min=1, max=MAX_K, step=1,
                                value=5), "5em"),
    ], body=lambda chosen: [
        html.P(id="sweeps-summary", className="wb-note"),
        exports.graph("sweeps-mosaic", chosen),
        html.Div(id="sweeps-open", className="wb-note"),
        exports.graph("sweeps-lines", chosen),
    ])


exports.follow("sweeps-run", page="sweeps", graphs=["sweeps-mosaic", "sweeps-lines"])


def _table(run_id: str, name: str) -> pd.DataFrame:
    declared = {"scores": SCORES, "cells": CELLS}[name]
    return data.table(data.get_run(run_id, shows=SHOWS), name).reindex(columns=declared.names)


def _split(value: str) -> tuple[str, str]:
    experiment, _, metric = value.partition(SEP)
    return experiment, metric


def _choices(scores: pd.DataFrame) -> pd.DataFrame:
    """The sweep's (experiment, metric) pairs, one row each, in the dropdown's order."""
    return scores[["experiment", "metric"]].drop_duplicates().sort_values(["experiment",
                                                                          "metric"])


def _selected(run_id: str, value: str) -> pd.DataFrame:
    """The scores of the metric dropdown's ``value`` (``experiment|metric``).

    Raises:
        Refused: the sweep scored no such metric.
    """
    scores = _table(run_id, "scores")
    among("metric", value, [f"{r.experiment}{SEP}{r.metric}"
                            for r in _choices(scores).itertuples()], "the sweep's metrics")
    experiment, metric = _split(value)
    return scores[(scores.experiment == experiment) & (scores.metric == metric)]


@callback(Output("sweeps-metric", "options"), Output("sweeps-metric", "value"),
          Output("sweeps-summary", "children"), Output("sweeps-error", "children"),
          Input("sweeps-run", "value"))
@safe
def choose_sweep(run_id: RunId):
    scores = _table(run_id, "scores")
    cells = _table(run_id, "cells")
    counts = ", ".join(f"{n} {s}" for s, n in cells.status.value_counts().sort_index().items())
    summary = f"{len(cells)} cells: {counts}."
    pairs = _choices(scores)
    if pairs.empty:
        return [], None, summary, message(f"sweep {run_id} has no complete cell with scores")
    options = [{"label": f"{r.metric} ({r.experiment})", "value": f"{r.experiment}{SEP}{r.metric}"}
               for r in pairs.itertuples()]
    preferred = [o["value"] for o in options if o["value"].endswith(f"{SEP}induction")]
    return options, (preferred or [options[0]["value"]])[0], summary, None


@callback(Output("sweeps-mosaic", "figure"), Input("sweeps-run", "value"),
          Input("sweeps-metric", "value"), Input("sweeps-columns", "value"),
          Input("sweeps-k", "value"))
@safe
def draw_mosaic(run_id: RunId, value: Name, columns: Columns, k: TopK):
    if value is None:
        return no_update
    scores = _selected(run_id, value)
    return mosaic(scores, _split(value)[1], columns, k or 5)


def best_heads(scores: pd.DataFrame) -> pd.DataFrame:
    """Per checkpoint cell, the row of its best head (highest score)."""
    scored = scores[scores.step >= 0].dropna(subset=["score"])
    if scored.empty:
        return scored
    return scored.loc[scored.groupby("cell").score.idxmax()].sort_values(["series", "tokens"])


@callback(Output("sweeps-lines", "figure"), Input("sweeps-run", "value"),
          Input("sweeps-metric", "value"))
@safe
def draw_lines(run_id: RunId, value: Name):
    if value is None:
        return no_update
    metric = _split(value)[1]
    best = best_heads(_selected(run_id, value))
    return lines_figure(best, metric)


def cell_of(point: dict) -> int:
    """The sweep cell of a click on the mosaic: a row's label starts with its index.

    Raises:
        ValueError: the point's row is not such a label.
    """
    row = point.get("y")
    if not isinstance(row, str):
        raise ValueError(row)
    index = int(row.split(":", 1)[0][:10])  # the client's word is checked against the cells
    if not 0 <= index <= MAX_INDEX:
        raise ValueError(index)
    return index


@callback(Output("sweeps-open", "children"), Input("sweeps-mosaic", "clickData"),
          Input("sweeps-run", "value"))
@safe
def open_cell(cell: Annotated[int | None, Click(cell_of, "a click on a row of the mosaic")],
              run_id: RunId):
    if cell is None:
        return "Click a cell of the mosaic to open its run."
    cells = _table(run_id, "cells")
    match = cells[(cells.cell == cell) & (cells.run_id != "")]
    if match.empty:
        return message(f"sweep {run_id} has no run for cell {cell}")
    row = match.iloc[0]
    return html.Span([f"cell {row.cell}: {row.experiment} on {row.model} → ",
                      dcc.Link(f"open run {row.run_id}", id="sweeps-open-link",
                               href=links.run_link(row.run_id, row.experiment))])
