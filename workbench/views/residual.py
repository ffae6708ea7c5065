"""The residual stream of a recording, as the Residual stream page draws it: the L2 norm at
every layer boundary and position, and the first token's norm against the other
positions'.

Examples:
    >>> norms = resid_norms(rec, 0)                        # doctest: +SKIP
    >>> norm_heatmap(norms, rec.tokens(0)), norm_lines(norms)   # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
from jaxtyping import Float

from workbench.recording.reader import Recording
from workbench.views.style import unique_labels


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
