"""Sweeps: one metric across every cell of a sweep. A mosaic (a row per cell: its model or
checkpoint and varying config values; a column per head of the layer x head grid, or the
cell's top-k heads; colour the score, the 95% interval on hover); for sweeps over training
checkpoints, the best head's score with its interval against tokens seen, one line per
trained model; click a mosaic cell to open its run.

Everything shown is read from the sweep run's ``scores`` and ``cells`` tables, by their
declarations in :mod:`workbench.harness.sweep_tables`."""

from __future__ import annotations

import json
from typing import Annotated, Any

import dash
import numpy as np
import pandas as pd
import plotly.graph_objects as go
from dash import Input, Output, callback, dcc, html, no_update

from dashboards.components import data, exports, links
from dashboards.components.controls import labelled
from dashboards.components.messages import message, safe, safe_layout
from dashboards.components.skeleton import run_page
from dashboards.components.values import MAX_INDEX, Click, Name, OneOf, RunId, Whole, among
from workbench.harness.sweep_tables import CELLS, SCORES
from workbench.views import pages

SHOWS = pages.shows("/sweeps")
dash.register_page(__name__, path="/sweeps", name="Sweeps",
                   order=pages.order("/sweeps"), experiments=SHOWS)

EMPTY = "No sweeps yet. Run one with `workbench sweep data/sweeps/seeds.toml`."
SEP = "|"
"""Joins an experiment and a metric in the metric dropdown's values."""
MARGIN = {"l": 10, "r": 10, "t": 60, "b": 10}
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


def row_label(cell: Any) -> str:
    """A mosaic row: the model (a checkpoint as ``L2 step 400``) and the varying values."""
    model = str(cell.model)
    if cell.step >= 0:
        model = f"{str(cell.series).rsplit('/', 1)[-1]} step {cell.step}"
    values = " ".join(f"{k}={v}" for k, v in json.loads(cell.grid).items())
    return f"{cell.cell}: {model} {values}".strip()


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


def mosaic(scores: pd.DataFrame, metric: str, columns: str, k: int) -> go.Figure:
    """The mosaic figure: a row per cell, a column per head (``grid``) or per rank
    (``top``, the cell's ``k`` best heads); customdata carries each point's run id."""
    cells = scores.drop_duplicates("cell").sort_values(["series", "step", "grid", "cell"])
    rows = [row_label(c) for c in cells.itertuples()]
    if columns == "top":
        ranked = scores.sort_values(["cell", "score"], ascending=[True, False])
        ranked = ranked.assign(rank=ranked.groupby("cell").cumcount()).query("rank < @k")
        col_of = ranked["rank"]
        labels = [f"#{i + 1}" for i in range(int(ranked["rank"].max()) + 1)]
        shown = ranked
    else:
        n_heads = int(scores["head"].max()) + 1
        col_of = scores.layer * n_heads + scores["head"]
        labels = [f"L{lay}H{h}" for lay in range(int(scores.layer.max()) + 1)
                  for h in range(n_heads)]
        shown = scores
    z = np.full((len(rows), len(labels)), np.nan)
    custom = np.full((len(rows), len(labels), 4), "", dtype=object)
    row_of = {c: i for i, c in enumerate(cells.cell)}
    for idx, r in zip(shown.index, shown.itertuples(), strict=True):
        i, j = row_of[r.cell], int(col_of[idx])
        z[i, j] = r.score
        custom[i, j] = [f"{r.ci_low:.3f}", f"{r.ci_high:.3f}", r.run_id, f"L{r.layer}H{r.head}"]
    fig = go.Figure(go.Heatmap(
        z=z, x=labels, y=rows, customdata=custom, colorscale="Viridis",
        colorbar={"title": metric},
        hovertemplate="%{y}<br>%{customdata[3]}: " + metric + " %{z:.3f}<br>95% CI "
                      "[%{customdata[0]}, %{customdata[1]}]<br>run %{customdata[2]}"
                      "<extra></extra>"))
    what = f"top {k} heads" if columns == "top" else "every head"
    fig.update_layout(title=f"{metric} of {what} in every cell (click one to open its run)",
                      height=min(1400, 180 + 24 * len(rows)), margin=MARGIN,
                      xaxis={"title": "rank" if columns == "top" else "head", "tickangle": -60},
                      yaxis={"autorange": "reversed", "type": "category"})
    return fig


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
    fig = go.Figure()
    if best.empty:
        fig.update_layout(title="no training checkpoints in this sweep (a line over training "
                          "needs models such as <run-id>/L2:*)", height=160, margin=MARGIN,
                          xaxis={"visible": False}, yaxis={"visible": False})
        return fig
    for (series, grid), df in best.groupby(["series", "grid"], sort=False):
        name = str(series).rsplit("/", 1)[-1] + ("" if grid == "{}" else f" {grid}")
        fig.add_scatter(
            x=df.tokens, y=df.score, name=name, mode="lines+markers",
            error_y={"type": "data", "symmetric": False, "array": df.ci_high - df.score,
                     "arrayminus": df.score - df.ci_low},
            customdata=np.stack([df.step, df.layer, df["head"]], axis=-1),
            hovertemplate=f"{name}<br>step %{{customdata[0]}} (%{{x}} tokens)<br>best head "
                          f"L%{{customdata[1]}}H%{{customdata[2]}}: {metric} %{{y:.3f}}"
                          "<extra></extra>")
    fig.update_layout(title=f"max {metric} over heads against tokens seen (95% CI)",
                      height=440, margin=MARGIN, xaxis={"title": "tokens seen"},
                      yaxis={"title": f"max {metric}"})
    return fig


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
