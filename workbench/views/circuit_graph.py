"""The figures of a ``circuit`` run, as the Circuit page draws them: the faithfulness of the
top-``|score|`` circuits against their size, and one circuit as a graph of heads and MLPs.

The graph puts each head at (its head index, its layer), each layer's MLP in a column to
the right of the heads, the embedding below the first layer and the logits above the last.
An edge of the circuit is a line from its sender to its receiver: a head's query input is
the head; a key or value input, shared by the query heads of one key-value head, is the
middle of that group. Lines are coloured by the sign of the edge's score (positive: the
edge moves the metric toward its clean value) and drawn wider the larger its ``|score|``;
hovering over the middle of a line names the edge and its score. Past
:data:`MAX_DRAWN` edges only the strongest are drawn, and the title says so.

Examples:
    >>> run = RunStore("data/runs").latest(experiment="circuit")              # doctest: +SKIP
    >>> faithfulness_figure(run.table("faithfulness"), selected=0.05)          # doctest: +SKIP
    >>> graph_figure(run.table("edges"), run.table("nodes"), n_edges=40,       # doctest: +SKIP
    ...              n_layers=30, n_heads=9, n_kv_heads=3)
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from workbench.views.style import set_title

MAX_DRAWN = 400
"""Edges a graph draws at most (the strongest): more lines hide one another."""
POSITIVE, NEGATIVE, QUIET = "#2563eb", "#dc2626", "#d1d5db"
WIDTHS = (1.0, 2.5, 5.0)
"""Line widths of the weakest, middle and strongest third of the drawn edges' ``|score|``."""
MARGIN = {"l": 10, "r": 10, "t": 70, "b": 10}

_HEAD = re.compile(r"^L(\d+)H(\d+)$")
_KV = re.compile(r"^L(\d+)KV(\d+)\.([kv])$")
_MLP = re.compile(r"^L(\d+)MLP(?:\.in)?$")


def faithfulness_figure(curve: pd.DataFrame, selected: float | None = None,
                        level: float = 0.8) -> go.Figure:
    """Faithfulness against the circuit's size (fraction of the edges, log scale), with
    its 95% interval, the ends 0 and 1 dashed, ``level`` dotted and the ``selected``
    size marked."""
    curve = curve.sort_values("fraction")
    fig = go.Figure()
    fig.add_scatter(x=np.r_[curve.fraction, curve.fraction[::-1]],
                    y=np.r_[curve.ci_high, curve.ci_low[::-1]], fill="toself",
                    fillcolor="rgba(37, 99, 235, 0.15)", line={"width": 0}, mode="lines",
                    hoverinfo="skip", name="95% interval")
    fig.add_scatter(x=curve.fraction, y=curve.faithfulness, mode="lines+markers",
                    name="faithfulness", customdata=curve.n_edges, line={"color": POSITIVE},
                    hovertemplate="%{x:.3%} of the edges (%{customdata})<br>"
                                  "faithfulness %{y:.3f}<extra></extra>")
    for y, dash in ((0, "dash"), (1, "dash"), (level, "dot")):
        fig.add_hline(y=y, line={"dash": dash, "color": "#9ca3af", "width": 1})
    if selected is not None:
        fig.add_vline(x=selected, line={"color": "#111827", "width": 1})
    set_title(fig, "faithfulness of the top-|score| circuit against its size (MIB)")
    fig.update_layout(height=380, margin=MARGIN, showlegend=False,
                      xaxis={"title": "circuit size (fraction of the edges)", "type": "log",
                             "tickformat": ".1%"},
                      yaxis={"title": "faithfulness"})
    return fig


def node_position(name: str, n_layers: int, n_heads: int, n_kv_heads: int
                  ) -> tuple[float, float]:
    """Where a sender or receiver is drawn: ``(x, layer)``.

    Raises:
        ValueError: a name that is not a node of the graph.
    """
    if name == "embed":
        return (n_heads - 1) / 2, -1
    if name == "logits":
        return (n_heads - 1) / 2, n_layers
    if (m := _HEAD.match(name.split(".")[0])) is not None:  # a head, or its q input
        return float(m.group(2)), int(m.group(1))
    if (m := _KV.match(name)) is not None:
        group = n_heads // n_kv_heads
        return int(m.group(2)) * group + (group - 1) / 2, int(m.group(1))
    if (m := _MLP.match(name)) is not None:
        return n_heads + 0.5, int(m.group(1))
    raise ValueError(f"{name!r} is not a node of the circuit graph")


def circuit_edges(edges: pd.DataFrame, n_edges: int) -> pd.DataFrame:
    """The circuit of the ``n_edges`` edges of smallest rank (largest ``|score|``)."""
    return edges.nsmallest(n_edges, "rank")


def graph_figure(edges: pd.DataFrame, nodes: pd.DataFrame, *, n_edges: int, n_layers: int,
                 n_heads: int, n_kv_heads: int) -> go.Figure:
    """The circuit of the top ``n_edges`` edges as lines between heads and MLPs."""
    circuit = circuit_edges(edges, n_edges)
    drawn = circuit.head(MAX_DRAWN)
    fig = go.Figure()
    _add_nodes(fig, nodes, set(circuit.sender) | {node_of(r) for r in circuit.receiver},
               n_layers, n_heads, n_kv_heads)
    top = float(drawn.score.abs().max()) if len(drawn) else 1.0
    for sign, colour in ((1, POSITIVE), (-1, NEGATIVE)):
        part = drawn[np.sign(drawn.score) == sign]
        bins = np.minimum((part.score.abs() / top * len(WIDTHS)).astype(int), len(WIDTHS) - 1)
        for b, width in enumerate(WIDTHS):
            _add_lines(fig, part[bins == b], colour, width, n_layers, n_heads, n_kv_heads)
    shown = (f"{len(circuit)} edges" if len(drawn) == len(circuit)
             else f"the strongest {len(drawn)} of its {len(circuit)} edges")
    set_title(fig, f"the circuit: {shown}; blue raises the metric toward clean, red lowers "
                   "it; width: |score|")
    fig.update_layout(height=max(420, 26 * (n_layers + 2)), margin=MARGIN, showlegend=False,
                      xaxis={"title": "head (right: the layer's MLP)", "zeroline": False,
                             "tickvals": [*range(n_heads), n_heads + 0.5],
                             "ticktext": [*map(str, range(n_heads)), "MLP"]},
                      yaxis={"title": "layer (embedding below, logits above)",
                             "zeroline": False, "range": [-1.6, n_layers + 0.6]})
    return fig


def node_of(receiver: str) -> str:
    """The node a receiver input belongs to (a key-value input stays its group's)."""
    return receiver if _KV.match(receiver) else receiver.split(".")[0]


def _add_nodes(fig: go.Figure, nodes: pd.DataFrame, used: set[str], n_layers: int,
               n_heads: int, n_kv_heads: int) -> None:
    """Every node as a marker, those the circuit uses dark; hover: its summed scores."""
    for in_circuit in (False, True):
        part = nodes[nodes.node.isin(used) == in_circuit]
        xy = [node_position(n, n_layers, n_heads, n_kv_heads) for n in part.node]
        fig.add_scatter(
            x=[p[0] for p in xy], y=[p[1] for p in xy], mode="markers",
            marker={"size": 9 if in_circuit else 6,
                    "color": "#111827" if in_circuit else QUIET},
            customdata=np.c_[part.node, part.score_out, part.score_in],
            hovertemplate="%{customdata[0]}<br>out %{customdata[1]:.4g}"
                          "<br>in %{customdata[2]:.4g}<extra></extra>")
    groups = [f"L{layer}KV{g}.k" for layer in range(n_layers) for g in range(n_kv_heads)]
    used_groups = [g for g in groups if g in used or g.replace(".k", ".v") in used]
    if used_groups:  # a key-value group's own marker, where its k or v input is used
        xy = [node_position(g, n_layers, n_heads, n_kv_heads) for g in used_groups]
        fig.add_scatter(x=[p[0] for p in xy], y=[p[1] - 0.25 for p in xy], mode="markers",
                        marker={"size": 7, "symbol": "diamond", "color": "#6b7280"},
                        text=[g.split(".")[0] for g in used_groups],
                        hovertemplate="%{text} (keys and values)<extra></extra>")


def _add_lines(fig: go.Figure, part: pd.DataFrame, colour: str, width: float, n_layers: int,
               n_heads: int, n_kv_heads: int) -> None:
    """Edges as one trace of line segments, and their midpoints for hovering."""
    if part.empty:
        return
    xs, ys, mx, my = [], [], [], []
    for sender, receiver in zip(part.sender, part.receiver, strict=True):
        (x0, y0), (x1, y1) = (node_position(sender, n_layers, n_heads, n_kv_heads),
                              node_position(receiver, n_layers, n_heads, n_kv_heads))
        xs += [x0, x1, None]
        ys += [y0, y1, None]
        mx.append((x0 + x1) / 2)
        my.append((y0 + y1) / 2)
    fig.add_scatter(x=xs, y=ys, mode="lines", hoverinfo="skip",
                    line={"color": colour, "width": width}, opacity=0.7)
    fig.add_scatter(x=mx, y=my, mode="markers", marker={"size": 6, "color": colour,
                                                        "opacity": 0.01},
                    customdata=np.c_[part.sender, part.receiver, part.score, part["rank"]],
                    hovertemplate="%{customdata[0]} → %{customdata[1]}<br>score "
                                  "%{customdata[2]:.4g} (rank %{customdata[3]})<extra></extra>")
