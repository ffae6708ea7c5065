"""The figures of a ``sweep`` run, as the Sweeps page draws them: a mosaic of one metric over
every cell (a row a cell, a column a head or a rank), and the best head's score over
training for the cells of checkpoints.

Examples:
    >>> mosaic(scores, "induction", "grid", k=10)      # doctest: +SKIP
    >>> lines_figure(best, "induction")                 # doctest: +SKIP
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

MARGIN = {"l": 10, "r": 10, "t": 60, "b": 10}


def row_label(cell: Any) -> str:
    """A mosaic row: the model (a checkpoint as ``L2 step 400``) and the varying values."""
    model = str(cell.model)
    if cell.step >= 0:
        model = f"{str(cell.series).rsplit('/', 1)[-1]} step {cell.step}"
    values = " ".join(f"{k}={v}" for k, v in json.loads(cell.grid).items())
    return f"{cell.cell}: {model} {values}".strip()


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


def lines_figure(best: pd.DataFrame, metric: str) -> go.Figure:
    """Each checkpoint series' best head score against tokens seen, with 95% intervals
    (``best``: one row a checkpoint cell, its best head); a note when the sweep has no
    checkpoints."""
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
