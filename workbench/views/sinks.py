"""The figures of an ``attention-sinks`` run, as the Sinks page draws them: sink rates by
input, where the attention mass goes by token type, the receivers of the most weight,
massive activations, and the streaming losses with a few sink tokens kept.

Examples:
    >>> run = RunStore("data/runs").latest(experiment="attention-sinks")  # doctest: +SKIP
    >>> rates_figure(run.table("sink_rates"))                              # doctest: +SKIP
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

MARGIN = {"l": 10, "r": 10, "t": 50, "b": 10}


TYPE_COLOURS = {"bos": "#1f2937", "cls": "#1f2937", "sep": "#b91c1c",
                "first_content": "#f59e0b", "newline": "#2563eb", "punctuation": "#10b981",
                "other": "#d1d5db"}


LAYER_GROUP_COLOURS = {"all": "#2563eb", "sliding": "#f59e0b", "global": "#1f2937"}


def rates_figure(rates: pd.DataFrame) -> go.Figure:
    """Sink_1^eps by input, with the bootstrap interval over sequences: one bar per input
    over every layer, and beside it the sliding and the global layers alone when the model
    has both (a run written before layer groups has the first only)."""
    if "layers" not in rates.columns:
        rates = rates.assign(layers="all")
    fig = go.Figure()
    for group, part in rates.groupby("layers", sort=False):
        fig.add_bar(
            x=part.input, y=part.sink_rate, name=f"{group} layers",
            marker_color=LAYER_GROUP_COLOURS.get(str(group)),
            error_y={"type": "data", "symmetric": False,
                     "array": part.ci_high - part.sink_rate,
                     "arrayminus": part.sink_rate - part.ci_low},
            hovertemplate=f"%{{x}}, {group} layers<br>sink rate %{{y:.1f}}%<extra></extra>")
    fig.update_layout(title=f"sink rate Sink_1^{rates.eps.iloc[0]:g} by input (% of heads)",
                      yaxis={"title": "% of (layer, head)", "range": [0, 100]},
                      barmode="group", showlegend=rates.layers.nunique() > 1,
                      height=420, margin=MARGIN)
    return fig


def mass_figure(scores: pd.DataFrame, input_name: str) -> go.Figure:
    """Share of attention received by each token type, by layer (mean over heads)."""
    shares = scores[scores.metric.str.startswith("share_")]
    by_layer = shares.groupby(["metric", "layer"]).score.mean().unstack("layer")
    fig = go.Figure()
    for metric, row in by_layer.iterrows():
        name = str(metric).removeprefix("share_")
        fig.add_bar(x=row.index, y=row.to_numpy(), name=name,
                    marker_color=TYPE_COLOURS.get(name))
    fig.update_layout(barmode="stack", title=f"where the mass goes, by layer ({input_name})",
                      xaxis={"title": "layer"}, yaxis={"title": "share of attention",
                                                       "range": [0, 1]},
                      height=420, margin=MARGIN)
    return fig


def receivers_figure(receivers: pd.DataFrame, input_name: str) -> go.Figure:
    """Weight received by the most-attended, second and third key, by layer, with the most
    common token type of each (hover)."""
    df = receivers[receivers.input == input_name]
    fig = go.Figure()
    for rank, part in df.groupby("rank"):
        layers, share, common = [], [], []
        for layer, g in part.groupby("layer"):
            fraction = g.fraction.to_numpy()
            layers.append(layer)
            share.append(np.average(g.mean_share, weights=g["count"]))
            common.append(f"{g.token_type.to_numpy()[fraction.argmax()]} "
                          f"({fraction.max():.0%})")
        fig.add_scatter(x=np.array(layers), y=np.array(share), mode="lines+markers",
                        name=f"rank {rank}", customdata=np.array(common, dtype=object),
                        hovertemplate="layer %{x}: %{y:.3f}<br>most often %{customdata}"
                                      "<extra></extra>")
    fig.update_layout(title=f"weight on the top receiving keys ({input_name})",
                      xaxis={"title": "layer"}, yaxis={"title": "mean share", "range": [0, 1]},
                      height=420, margin=MARGIN)
    return fig


def massive_figure(massive: pd.DataFrame, input_name: str, eps: float) -> go.Figure:
    """Top-3 |activation| and the median by layer boundary (log scale), and the share of
    sink heads of the layer reading each boundary (right axis)."""
    df = massive[massive.input == input_name]
    fig = go.Figure()
    for col in ("top1", "top2", "top3", "median_abs"):
        fig.add_scatter(x=df.layer, y=df[col], mode="lines+markers", name=col,
                        customdata=np.stack([df.top1_position, df.top1_dim], axis=-1),
                        hovertemplate="boundary %{x}: %{y:.3g}<br>top1 at position "
                                      "%{customdata[0]}, dim %{customdata[1]}<extra></extra>")
    read = df[df.sink_head_share.notna()]  # the last boundary is read by no layer
    fig.add_scatter(x=read.layer, y=read.sink_head_share, name=f"sink heads (alpha_1 > {eps:g})",
                    yaxis="y2", mode="lines", line={"dash": "dot", "color": "#b91c1c"})
    fig.update_layout(
        title=f"massive activations by layer boundary ({input_name}; median over sequences)",
        xaxis={"title": "layer boundary (0 = embeddings; layer l reads boundary l)"},
        yaxis={"title": "|activation|", "type": "log"},
        yaxis2={"title": "share of heads", "overlaying": "y", "side": "right",
                "type": "linear", "range": [0, 1.05], "tickmode": "linear", "tick0": 0,
                "dtick": 0.2, "showgrid": False},
        height=440, margin={**MARGIN, "r": 60}, legend={"x": 1.08})
    return fig


def streaming_figure(losses: pd.DataFrame, table: pd.DataFrame) -> go.Figure:
    """Perplexity against position for each variant, in bins of 1/32 of the text."""
    n_tokens = int(table.n_tokens.iloc[0])
    width = max(1, n_tokens // 32)
    fig = go.Figure()
    for label, part in losses.groupby("label", sort=False):
        binned = part.groupby(part.position // width * width).nll.mean()
        fig.add_scatter(x=binned.index + width / 2, y=np.exp(binned.to_numpy()), name=label,
                        mode="lines+markers" if str(label).startswith("recompute") else "lines")
    window = table.window.dropna()
    if len(window):
        fig.add_vline(x=int(window.iloc[0]), line_dash="dash", line_color="#6b7280",
                      annotation_text="W: eviction starts")
    fig.update_layout(title=f"streaming perplexity by position (bins of {width} tokens)",
                      xaxis={"title": "position"}, yaxis={"title": "perplexity", "type": "log"},
                      height=460, margin=MARGIN)
    return fig


def running_figure(losses: pd.DataFrame, table: pd.DataFrame) -> go.Figure:
    """exp of the mean loss over positions W..t, for each variant: where the curves end is
    the table's ``ppl_beyond_window`` (and, for recompute, its ``ppl_matched``)."""
    window = int(table.window.dropna().iloc[0])
    fig = go.Figure()
    for label, part in losses.groupby("label", sort=False):
        part = part[part.position >= window].sort_values("position")
        running = np.exp(part.nll.cumsum().to_numpy() / np.arange(1, len(part) + 1))
        fig.add_scatter(x=part.position, y=running, name=label, mode="lines")
    fig.update_layout(title=f"streaming perplexity: running mean over positions {window}..t",
                      xaxis={"title": "position t"}, yaxis={"title": "perplexity",
                                                            "type": "log"},
                      height=460, margin=MARGIN)
    return fig
