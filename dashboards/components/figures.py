"""Plotly figures of a recording's attention patterns and residual-stream norms, and the
figures every page shares, which live in the library (:mod:`workbench.views.style`) so
that a page and a notebook draw the same figure from the same call."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

import numpy as np
import plotly.graph_objects as go
from jaxtyping import Float

from dashboards.components.values import OneOf
from workbench.recording.record import Recording
from workbench.views.style import (
    COLOUR_SCALES,
    LOG_FLOOR,
    MAX_DISCRETE,
    POWER,
    STOPS,
    TITLE_CHARS,
    ColourScale,
    colour_stops,
    discrete_colours,
    discrete_levels,
    head_heatmap,
    pattern_from_rows,
    pattern_heatmap,
    scale_colorbar,
    set_title,
    unique_labels,
    wrapped,
)

__all__ = ["COLOUR_SCALES", "LOG_FLOOR", "MAX_DISCRETE", "POWER", "STOPS", "TITLE_CHARS",
           "ColourScale", "Scale", "colour_stops", "discrete_colours", "discrete_levels",
           "head_heatmap", "norm_heatmap", "norm_lines", "pattern_from_rows", "pattern_grid",
           "pattern_heatmap", "resid_norms", "scale_colorbar", "set_title", "wrapped"]

Scale = Annotated[ColourScale | None, OneOf(COLOUR_SCALES)]
"""A colour-scale switch's value as a callback takes it: ``None`` (a switch not yet set,
or a request that leaves it out) is the linear scale."""


def pattern_grid(rec: Recording, prompt: int, max_tokens: int = 24,
                 scale: ColourScale = "linear") -> go.Figure:
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
        colorscale=colour_stops(scale), zmin=0, zmax=1, showscale=False,
        hovertemplate="layer %{customdata[0]}, head %{customdata[1]}<extra></extra>",
    ))
    centre = n / (2 * cell)
    fig.update_layout(
        height=min(1400, 120 + rec.n_layers * 40), margin={"l": 40, "r": 10, "b": 10},
        xaxis={"side": "top", "tickvals": [h + centre for h in range(rec.n_heads)],
               "ticktext": [str(h) for h in range(rec.n_heads)]},
        yaxis={"title": "layer", "autorange": "reversed",
               "tickvals": [layer + centre for layer in range(rec.n_layers)],
               "ticktext": [str(layer) for layer in range(rec.n_layers)]},
    )
    # the heads' numbers sit on top, so the title needs room above them
    set_title(fig, f"all heads: layers down, heads across (first {n} tokens); click one "
                   "to open it")
    return fig.update_layout(margin={"t": fig.layout.margin.t + 20})


def resid_norms(rec: Recording, prompt: int) -> Float[np.ndarray, "boundary pos"]:
    """L2 norm of the residual stream at every layer boundary and position."""
    return np.stack([np.linalg.norm(rec.resid(prompt, b), axis=-1)
                     for b in range(rec.n_layers + 1)])


def norm_heatmap(norms: Float[np.ndarray, "boundary pos"], tokens: Sequence[str]) -> go.Figure:
    """Residual norm by layer boundary and position, on a log colour scale."""
    labels = unique_labels(tokens)
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


