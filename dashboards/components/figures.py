"""Plotly figures of attention patterns and residual-stream norms."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from jaxtyping import Float

from workbench.recording.record import Recording


def _unique_labels(tokens: Sequence[str]) -> list[str]:
    """Axis labels must be unique, so each token gets its position."""
    return [f"{i}: {t!r}"[:24] for i, t in enumerate(tokens)]


def pattern_heatmap(pattern: Float[np.ndarray, "query key"], tokens: Sequence[str],
                    title: str) -> go.Figure:
    """One head's attention: rows are queries, columns are keys, labelled with tokens."""
    labels = _unique_labels(tokens)
    fig = go.Figure(go.Heatmap(
        z=pattern, x=labels, y=labels, colorscale="Blues", zmin=0, zmax=1,
        hovertemplate="query %{y}<br>key %{x}<br>weight %{z:.3f}<extra></extra>",
        colorbar={"title": "weight"},
    ))
    side = min(900, 160 + 14 * len(tokens))
    fig.update_layout(title=title, height=side + 80, margin={"l": 10, "r": 10, "t": 50, "b": 10},
                      xaxis={"title": "key", "tickangle": -60, "side": "bottom"},
                      yaxis={"title": "query", "autorange": "reversed"})
    return fig


def pattern_grid(rec: Recording, prompt: int, max_tokens: int = 24) -> go.Figure:
    """Every head's pattern as one small multiple: layers down, heads across.

    The grid is drawn as a single image (one matrix with a gap between heads), which stays
    fast for 30 layers x 9 heads; patterns longer than ``max_tokens`` show their first
    ``max_tokens`` positions. Click a cell to open that head.
    """
    n = min(len(rec.tokens(prompt)), max_tokens)
    gap = 1
    cell = n + gap
    grid = np.full((rec.n_layers * cell, rec.n_heads * cell), np.nan)
    for layer in range(rec.n_layers):
        block = rec.pattern(prompt, layer, queries=(0, n))[:, :, :n]  # reads n rows only
        for head in range(rec.n_heads):
            grid[layer * cell: layer * cell + n, head * cell: head * cell + n] = block[head]
    # Coordinates in units of heads/layers; customdata carries the exact (layer, head).
    xs, ys = np.arange(grid.shape[1]) / cell, np.arange(grid.shape[0]) / cell
    layer_of, head_of = np.meshgrid(np.arange(grid.shape[0]) // cell,
                                    np.arange(grid.shape[1]) // cell, indexing="ij")
    fig = go.Figure(go.Heatmap(
        z=grid, x=xs, y=ys, customdata=np.stack([layer_of, head_of], axis=-1),
        colorscale="Blues", zmin=0, zmax=1, showscale=False,
        hovertemplate="layer %{customdata[0]}, head %{customdata[1]}<extra></extra>",
    ))
    centre = n / (2 * cell)
    fig.update_layout(
        title=f"all heads: layers down, heads across (first {n} tokens); click one to open it",
        height=min(1400, 120 + rec.n_layers * 40), margin={"l": 40, "r": 10, "t": 70, "b": 10},
        xaxis={"side": "top", "tickvals": [h + centre for h in range(rec.n_heads)],
               "ticktext": [str(h) for h in range(rec.n_heads)]},
        yaxis={"title": "layer", "autorange": "reversed",
               "tickvals": [layer + centre for layer in range(rec.n_layers)],
               "ticktext": [str(layer) for layer in range(rec.n_layers)]},
    )
    return fig


def resid_norms(rec: Recording, prompt: int) -> Float[np.ndarray, "boundary pos"]:
    """L2 norm of the residual stream at every layer boundary and position."""
    return np.stack([np.linalg.norm(rec.resid(prompt, b), axis=-1)
                     for b in range(rec.n_layers + 1)])


def norm_heatmap(norms: Float[np.ndarray, "boundary pos"], tokens: Sequence[str]) -> go.Figure:
    """Residual norm by layer boundary and position, on a log colour scale."""
    labels = _unique_labels(tokens)
    fig = go.Figure(go.Heatmap(
        z=np.log10(np.maximum(norms, 1e-6)), x=labels, y=list(range(norms.shape[0])),
        customdata=norms, colorscale="Viridis", colorbar={"title": "log10 ‖x‖"},
        hovertemplate="boundary %{y}<br>token %{x}<br>‖x‖ = %{customdata:.1f}<extra></extra>",
    ))
    fig.update_layout(title="residual-stream norm by layer boundary and position",
                      height=520, margin={"l": 10, "r": 10, "t": 50, "b": 10},
                      xaxis={"title": "position", "tickangle": -60},
                      yaxis={"title": "layer boundary (0 = embeddings)",
                             "autorange": "reversed"})
    return fig


def norm_lines(norms: Float[np.ndarray, "boundary pos"]) -> go.Figure:
    """First token's norm against the median of the other positions, by layer boundary."""
    boundaries = list(range(norms.shape[0]))
    fig = go.Figure()
    fig.add_scatter(x=boundaries, y=norms[:, 0], name="position 0", mode="lines+markers")
    if norms.shape[1] > 1:
        fig.add_scatter(x=boundaries, y=np.median(norms[:, 1:], axis=1),
                        name="median of other positions", mode="lines+markers")
    fig.update_layout(title="first token vs the rest", height=380,
                      xaxis={"title": "layer boundary"}, yaxis={"title": "‖x‖", "type": "log"},
                      margin={"l": 10, "r": 10, "t": 50, "b": 10})
    return fig


def head_heatmap(scores: pd.DataFrame, metric: str, *, title: str | None = None,
                 zmin: float | None = None, zmax: float | None = None,
                 colorscale: str = "Viridis") -> go.Figure:
    """A layer x head heatmap of one metric from a long-format ``head_scores`` table.

    Hover shows the score and, when the table has them, its 95% interval. Click data
    carries ``x`` = head and ``y`` = layer.
    """
    df = scores[scores.metric == metric]
    n_layers, n_heads = int(df["layer"].max()) + 1, int(df["head"].max()) + 1
    grid = np.full((n_layers, n_heads), np.nan)
    low = np.full_like(grid, np.nan)
    high = np.full_like(grid, np.nan)
    for row in df.itertuples():
        grid[row.layer, row.head] = row.score
        if "ci_low" in df.columns:
            low[row.layer, row.head], high[row.layer, row.head] = row.ci_low, row.ci_high
    hover = "L%{y}H%{x}<br>" + metric + " = %{z:.3f}"
    if "ci_low" in df.columns:
        hover += "<br>95% CI [%{customdata[0]:.3f}, %{customdata[1]:.3f}]"
    fig = go.Figure(go.Heatmap(
        z=grid, x=list(range(n_heads)), y=list(range(n_layers)),
        customdata=np.stack([low, high], axis=-1), zmin=zmin, zmax=zmax,
        colorscale=colorscale, hovertemplate=hover + "<extra></extra>",
        colorbar={"title": metric},
    ))
    fig.update_layout(title=title or metric, height=min(900, 160 + 22 * n_layers),
                      margin={"l": 10, "r": 10, "t": 50, "b": 10},
                      xaxis={"title": "head", "dtick": 1},
                      yaxis={"title": "layer", "autorange": "reversed", "dtick": 1})
    return fig


def pattern_from_rows(rows: pd.DataFrame, n_tokens: int) -> Float[np.ndarray, "query key"]:
    """One head's pattern stored as long rows (``query, key, weight``; e.g. only the lower
    triangle a causal query can see) as a full ``[query, key]`` matrix, zeros elsewhere."""
    grid = np.zeros((n_tokens, n_tokens))
    grid[rows["query"].to_numpy(), rows["key"].to_numpy()] = rows["weight"].to_numpy()
    return grid
