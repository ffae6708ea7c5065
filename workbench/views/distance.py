"""The figures of an ``induction-distance`` run, as the Distance page draws them: each chosen
head's induction score against the distance between a token's two occurrences, every
layer's best head at every distance, and the in-context loss drop against distance.

Examples:
    >>> run = RunStore("data/runs").latest(experiment="induction-distance")  # doctest: +SKIP
    >>> curves_figure(run.table("distance_scores"), [(1, 2)], window=None)     # doctest: +SKIP
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from workbench.views.qk import head_label

MARGIN = {"l": 10, "r": 10, "t": 60, "b": 10}


def curves_figure(scores: pd.DataFrame, heads: list[tuple[int, int]], window: int | None
                  ) -> go.Figure:
    """Each chosen head's score against distance, with intervals and its null."""
    fig = go.Figure()
    for layer, head in heads:
        rows = scores[(scores.layer == layer) & (scores["head"] == head)].sort_values(
            "distance")
        kind = rows.layer_type.iloc[0] if len(rows) else ""
        fig.add_scatter(x=rows.distance, y=rows.score, mode="lines+markers",
                        name=f"{head_label(layer, head)} ({kind})",
                        error_y={"type": "data", "symmetric": False,
                                 "array": (rows.ci_high - rows.score).to_numpy(),
                                 "arrayminus": (rows.score - rows.ci_low).to_numpy()})
        fig.add_scatter(x=rows.distance, y=rows.null, mode="lines", showlegend=False,
                        line={"dash": "dot", "width": 1}, hoverinfo="skip")
    if window:
        fig.add_vline(x=window, line={"dash": "dash", "color": "#9ca3af"},
                      annotation_text=f"window {window}")
    fig.update_layout(title="induction (Olsson) score against the distance between the "
                            "occurrences<br><sup>dotted: uniform attention over the keys "
                            "each query sees</sup>", height=460, margin=MARGIN,
                      xaxis={"title": "distance D (tokens)", "type": "log"},
                      yaxis={"title": "weight on the earlier successor"})
    return fig


def layers_figure(scores: pd.DataFrame) -> go.Figure:
    """Every layer's best head score at every distance."""
    best = scores.pivot_table(index="layer", columns="distance", values="score", aggfunc="max")
    kinds = scores.drop_duplicates("layer").set_index("layer").layer_type
    fig = go.Figure(go.Heatmap(
        z=best.to_numpy(), x=[str(d) for d in best.columns],
        y=[f"{layer} ({kinds[layer]})" for layer in best.index], colorscale="Viridis",
        zmin=0, hovertemplate="layer %{y}<br>D %{x}<br>best head %{z:.3f}<extra></extra>"))
    fig.update_layout(title="each layer's best head at each distance", height=460,
                      margin=MARGIN, xaxis={"title": "distance D (tokens)", "type": "category"},
                      yaxis={"title": "layer", "autorange": "reversed"})
    return fig


def loss_figure(losses: pd.DataFrame) -> go.Figure:
    """The in-context loss drop against distance, with intervals."""
    rows = losses.sort_values("distance")
    fig = go.Figure(go.Scatter(
        x=rows.distance, y=rows["drop"], mode="lines+markers", name="loss drop",
        error_y={"type": "data", "symmetric": False,
                 "array": (rows.ci_high - rows["drop"]).to_numpy(),
                 "arrayminus": (rows["drop"] - rows.ci_low).to_numpy()}))
    fig.add_hline(y=0, line={"color": "#9ca3af", "width": 1})
    fig.update_layout(title="in-context loss drop: first occurrence minus second (nats)",
                      height=460, margin=MARGIN,
                      xaxis={"title": "distance D (tokens)", "type": "log"},
                      yaxis={"title": "nats"})
    return fig
