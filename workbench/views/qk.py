"""A head's attention score split over upstream components, as the Why page draws it: each
component's part of one query-key pair's score, the query's attention row, the query
component x key component matrix, and the mean part over every prompt with its bootstrap
interval (tables of a ``qk-attribution`` run).

Components are named ``embed``, ``L<layer>H<head>``, ``L<layer>MLP`` and
``L<layer>attn_bias``, and any other name is a bias of the explained head itself.

Examples:
    >>> sorted(["L1H0", "embed", "L0MLP", "L0H3"], key=component_order)
    ['embed', 'L0H3', 'L0MLP', 'L1H0']
    >>> component_kind("L0MLP")
    'mlp'
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import plotly.graph_objects as go

MARGIN = {"l": 10, "r": 10, "t": 50, "b": 10}
KIND_COLOURS = {"embed": "#1f2937", "head": "#2563eb", "mlp": "#f59e0b", "bias": "#9ca3af"}
_COMPONENT = re.compile(r"^L(\d+)(H(\d+)|MLP|attn_bias)$")


def head_label(layer: int, head: int) -> str:
    return f"L{layer}H{head}"


def component_order(name: str) -> tuple[int, int, str]:
    """Sort key: embed first, then by layer (heads, then attention bias, then MLP), then
    the head's own biases."""
    if name == "embed":
        return (-1, 0, name)
    match = _COMPONENT.match(name)
    if match is None:
        return (10**6, 0, name)
    layer, what, head = match.groups()
    rank = int(head) if head is not None else (10**3 if what == "attn_bias" else 10**4)
    return (int(layer), rank, name)


def component_kind(name: str) -> str:
    """``embed``, ``head``, ``mlp`` or ``bias``: what a component is, for its colour."""
    if name == "embed":
        return "embed"
    match = _COMPONENT.match(name)
    if match is None or match.group(2) == "attn_bias":
        return "bias"
    return "mlp" if match.group(2) == "MLP" else "head"


def bars_figure(contrib: pd.DataFrame, title: str) -> go.Figure:
    """Each component's part of the score, in layer order, coloured by kind (mean over
    the query's pairs)."""
    mean = contrib.groupby("component").contribution.mean()
    order = sorted(mean.index, key=component_order)
    kinds = [component_kind(c) for c in order]
    fig = go.Figure(go.Bar(x=order, y=mean[order].to_numpy(),
                           marker_color=[KIND_COLOURS[k] for k in kinds],
                           hovertemplate="%{x}<br>%{y:.4f}<extra></extra>"))
    fig.update_layout(title=f"{title} (sum {mean.sum():.3f})", height=380, margin=MARGIN,
                      yaxis={"title": "part of the score"}, xaxis={"tickangle": -60})
    return fig


def aggregate_figure(att: pd.DataFrame, head: str, top: int = 12) -> go.Figure:
    """Mean part of the score over every prompt, with its 95% bootstrap interval, for the
    components largest on either side (in layer order)."""
    biggest = att.assign(size=att.contribution.abs()).groupby("component")["size"].max()
    shown = sorted(biggest.nlargest(top).index, key=component_order)
    fig = go.Figure()
    for side, colour in (("key", "#2563eb"), ("query", "#f59e0b")):
        rows = att[att.side == side].set_index("component").reindex(shown)
        fig.add_bar(x=shown, y=rows.contribution.to_numpy(), name=f"{side} side",
                    marker_color=colour,
                    error_y={"type": "data", "symmetric": False,
                             "array": (rows.ci_high - rows.contribution).to_numpy(),
                             "arrayminus": (rows.contribution - rows.ci_low).to_numpy()})
    n = int(att.n_prompts.max()) if len(att) else 0
    fig.update_layout(barmode="group", height=420, margin=MARGIN, xaxis={"tickangle": -60},
                      title=f"{head}: mean over {n} prompts, 95% bootstrap intervals",
                      yaxis={"title": "part of the score"})
    return fig


def pair_title(head: str, query: int, key: int, tokens: list[str]) -> str:
    """The words every figure of one query-key pair shares."""
    return f"{head}, query {query} '{tokens[query]}' on key {key} '{tokens[key]}'"


def strip_figure(rows: pd.DataFrame, tokens: list[str], query: int, keys: list[int],
                 head: str) -> go.Figure:
    """The query's attention row over the prompt's tokens, the explained keys outlined."""
    weights = np.zeros(len(tokens))
    weights[rows.key_pos.to_numpy()] = rows.weight.to_numpy()
    labels = [f"{i}:{t}" for i, t in enumerate(tokens)]
    fig = go.Figure(go.Heatmap(z=[weights], x=labels, y=["weight"], colorscale="Blues",
                               zmin=0, zmax=max(float(weights.max()), 1e-9),
                               hovertemplate="%{x}<br>weight %{z:.3f}<extra></extra>"))
    for k in keys:
        fig.add_shape(type="rect", x0=k - 0.5, x1=k + 0.5, y0=-0.5, y1=0.5,
                      line={"color": "#b91c1c", "width": 3})
    fig.update_layout(title=f"{head}: attention of query {query} '{tokens[query]}' "
                            f"(explained key outlined)", height=220, margin=MARGIN,
                      xaxis={"tickangle": -60})
    return fig


def matrix_figure(matrix: pd.DataFrame, title: str, score: float) -> go.Figure:
    """Query component x key component parts of the score (the top of each side, then
    other); the cells sum to the score."""
    grid = matrix.pivot_table(index="query_component", columns="key_component",
                              values="contribution", aggfunc="sum")
    rows = sorted(grid.index, key=lambda n: (n == "other", component_order(n)))
    cols = sorted(grid.columns, key=lambda n: (n == "other", component_order(n)))
    grid = grid.loc[rows, cols]
    top = float(np.abs(grid.to_numpy()).max()) or 1.0
    fig = go.Figure(go.Heatmap(z=grid.to_numpy(), x=cols, y=rows, colorscale="RdBu",
                               zmid=0, zmin=-top, zmax=top,
                               hovertemplate="query %{y}<br>key %{x}<br>%{z:.4f}<extra></extra>"))
    fig.update_layout(title=f"{title} (cells sum to {score:.3f})", height=420, margin=MARGIN,
                      xaxis={"title": "key component"}, yaxis={"title": "query component"})
    return fig
