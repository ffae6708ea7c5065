"""The figures of a ``logit-lens`` run, as the Lens page draws them: the answer's probability
at every layer boundary and read position, its mean over prompts by layer, and each
component's direct effect on the logit difference.

Examples:
    >>> run = RunStore("data/runs").latest(experiment="logit-lens")  # doctest: +SKIP
    >>> layers_figure(run.table("lens_layers"))                       # doctest: +SKIP
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

MARGIN = {"l": 10, "r": 10, "t": 50, "b": 10}
TOP_COMPONENTS = 30


KIND_COLOURS = {"embed": "#1f2937", "head": "#2563eb", "mlp": "#f59e0b", "bias": "#9ca3af"}


def grid_figure(rows: pd.DataFrame, tokens: pd.Series, title: str) -> go.Figure:
    """Layer boundaries down, read positions across: the answer's probability, the top
    token as each cell's text."""
    prob = rows.pivot_table(index="layer", columns="position", values="answer_prob")
    top = rows.pivot(index="layer", columns="position", values="top").loc[prob.index,
                                                                          prob.columns]
    answers = rows.drop_duplicates("position").set_index("position").answer
    labels = [f"{p}:{tokens.get(p, '')} -> {answers[p]}" for p in prob.columns]
    fig = go.Figure(go.Heatmap(
        z=prob.to_numpy(), x=labels, y=prob.index.tolist(), text=top.to_numpy(),
        texttemplate="%{text}", colorscale="Blues", zmin=0, zmax=1,
        hovertemplate="layer %{y}<br>%{x}<br>answer probability %{z:.3f}<br>top "
                      "'%{text}'<extra></extra>"))
    fig.update_layout(title=f"{title}: answer probability through the lens (text: the top "
                            "token)", height=640, margin=MARGIN,
                      xaxis={"title": "read position -> its answer", "tickangle": -60},
                      yaxis={"title": "layer boundary"})
    return fig


def layers_figure(layers: pd.DataFrame) -> go.Figure:
    """The mean answer probability per boundary with its interval, and the share of read
    positions whose top token is the answer."""
    fig = go.Figure()
    fig.add_scatter(x=layers.layer, y=layers.answer_prob, mode="lines+markers",
                    name="answer probability",
                    error_y={"type": "data", "symmetric": False,
                             "array": (layers.ci_high - layers.answer_prob).to_numpy(),
                             "arrayminus": (layers.answer_prob - layers.ci_low).to_numpy()})
    fig.add_scatter(x=layers.layer, y=layers.answer_top, mode="lines", name="answer on top",
                    line={"dash": "dot"})
    n = int(layers.n_prompts.max()) if len(layers) else 0
    fig.update_layout(title=f"mean over {n} prompts, 95% bootstrap intervals", height=420,
                      margin=MARGIN, xaxis={"title": "layer boundary"},
                      yaxis={"title": "probability / share", "range": [0, 1]})
    return fig


def direct_figure(direct: pd.DataFrame) -> go.Figure:
    """The components with the largest direct effects, in forward order, with intervals."""
    shown = direct.loc[direct.effect.abs().nlargest(TOP_COMPONENTS).index].sort_index()
    fig = go.Figure(go.Bar(
        x=shown.component, y=shown.effect,
        marker_color=[KIND_COLOURS.get(k, "#9ca3af") for k in shown.kind],
        error_y={"type": "data", "symmetric": False,
                 "array": (shown.ci_high - shown.effect).to_numpy(),
                 "arrayminus": (shown.effect - shown.ci_low).to_numpy()},
        hovertemplate="%{x}<br>%{y:.3f}<extra></extra>"))
    fig.update_layout(title=f"direct effects on the centred answer logit (sum over every "
                            f"component {direct.effect.sum():.3f})", height=420,
                      margin=MARGIN, xaxis={"tickangle": -60},
                      yaxis={"title": "logits"})
    return fig
