"""The figures of an ``ioi`` run's activation patching, as the Patching page draws them:
layers x positions of one patched site, and every head's output patched alone.

Examples:
    >>> run = RunStore("data/runs").latest(experiment="ioi")             # doctest: +SKIP
    >>> heads_figure(run.table("patch_heads"))                            # doctest: +SKIP
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

MARGIN = {"l": 10, "r": 10, "t": 50, "b": 10}
CHECKS = {-1: "every position", -2: "nothing"}
"""The cells of the checks, kept out of the heatmap and said in the note."""


def positions_figure(rows: pd.DataFrame, title: str) -> go.Figure:
    """Layers down, positions across (the checks' cells left out), 0..1 coloured."""
    cells = rows[rows.position >= 0]
    grid = cells.pivot_table(index="layer", columns="position", values="value")
    labels = cells.drop_duplicates("position").sort_values("position")
    checks = rows[rows.position < 0].groupby("position").value
    said = "; ".join(f"{CHECKS[p]}: {_fixed(checks.get_group(p).min())} to "
                     f"{_fixed(checks.get_group(p).max())}"
                     for p in CHECKS if p in checks.groups)
    fig = go.Figure(go.Heatmap(
        z=grid.to_numpy(), x=grid.columns.tolist(), y=grid.index.tolist(),
        colorscale="RdBu", zmid=0, zmin=-1, zmax=1,
        hovertemplate="layer %{y}, position %{x}<br>%{z:.3f}<extra></extra>"))
    fig.update_layout(
        title=f"{title} ({int(rows.n_prompts.max()) if len(rows) else 0} prompts"
              f"{'; checks: ' + said if said else ''})", height=560, margin=MARGIN,
        xaxis={"title": "position", "tickangle": -60, "tickmode": "array",
               "tickvals": labels.position.tolist(),
               "ticktext": [position_label(r) for r in labels.itertuples()]},
        yaxis={"title": "layer"})
    return fig


def heads_figure(heads: pd.DataFrame) -> go.Figure:
    """Layers down, heads across (every head at once left out)."""
    cells = heads[heads["head"] >= 0]
    grid = cells.pivot_table(index="layer", columns="head", values="value")
    n = int(heads.n_prompts.max()) if len(heads) else 0
    fig = go.Figure(go.Heatmap(
        z=grid.to_numpy(), x=grid.columns.tolist(), y=grid.index.tolist(),
        colorscale="RdBu", zmid=0, zmin=-1, zmax=1,
        hovertemplate="L%{y}H%{x}<br>%{z:.3f}<extra></extra>"))
    fig.update_layout(title=f"each head's output patched at every position ({n} prompts)",
                      height=560, margin=MARGIN, xaxis={"title": "head", "dtick": 1},
                      yaxis={"title": "layer"})
    return fig


def position_label(row) -> str:
    role = f" ({row.role})" if row.role else ""
    return f"{row.position}:{row.token}{role}"


def _fixed(value: float) -> str:
    return f"{round(float(value), 3) + 0.0:.3f}"  # no "-0.000"
