"""The figure of a ``head-overview`` run the Overview page draws beside its heatmap: a metric
by layer, the mean over heads with a band from the lowest to the highest head.

Examples:
    >>> run = RunStore("data/runs").latest(experiment="head-overview")        # doctest: +SKIP
    >>> layers_figure(run.table("head_scores"), "normalized_entropy")         # doctest: +SKIP
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go


def layers_figure(scores: pd.DataFrame, metric: str) -> go.Figure:
    """The metric by layer: the mean over heads, and a band from the lowest to the highest
    head of the layer."""
    by_layer = scores[scores.metric == metric].groupby("layer").score
    stats = pd.DataFrame({"mean": by_layer.mean(), "low": by_layer.min(),
                          "high": by_layer.max()})
    x = stats.index.to_numpy()
    fig = go.Figure()
    fig.add_scatter(x=x, y=stats.high, mode="lines", line={"width": 0}, showlegend=False,
                    hoverinfo="skip", name="highest head")
    fig.add_scatter(x=x, y=stats.low, mode="lines", line={"width": 0}, fill="tonexty",
                    fillcolor="rgba(37,99,235,0.2)", name="lowest to highest head")
    fig.add_scatter(x=x, y=stats["mean"], mode="lines+markers", name="mean over heads",
                    line={"color": "#2563eb"},
                    hovertemplate="layer %{x}: %{y:.3f}<extra>mean</extra>")
    fig.update_layout(title=f"{metric} by layer", xaxis={"title": "layer", "dtick": 1},
                      yaxis={"title": metric}, height=480,
                      margin={"l": 10, "r": 10, "t": 50, "b": 10})
    return fig
