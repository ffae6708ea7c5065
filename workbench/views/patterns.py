"""A recording's attention patterns as the Recording, Long context and Live pages draw them:
one head's pattern with token labels, every head's as small multiples, one query's row,
and one head's whole pattern pooled to screen resolution.
A notebook draws the same figures with ``workbench.show_pattern(rec, ...)`` and
``workbench.show_long(rec, ...)`` (:func:`show_pattern`, :func:`show_long`).

Both read only what they show from the recording: the first ``max_tokens`` query rows of a
pattern, or the pooled grid :meth:`~workbench.recording.reader.Recording.pooled` builds
block by block, so an 8,192-token pattern becomes at most ``OVERVIEW_CELLS`` cells a side
before any figure is made.

Examples:
    >>> rec = Recording.open("data/runs/<record run>")                  # doctest: +SKIP
    >>> show_pattern(rec, 0, layer=1, head=2, scale="log")              # doctest: +SKIP
    >>> long_overview(rec, 0, 1, 2, pooling="max").data[0].z.shape      # doctest: +SKIP
    (512, 512)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import plotly.graph_objects as go

from workbench.core.errors import WorkbenchError
from workbench.recording import sparse
from workbench.recording.reader import Pooled, Recording
from workbench.views.style import (
    COLOUR_SCALES,
    ColourScale,
    colour_stops,
    hidden_bar,
    layer_labels,
    log_colour_bar,
    pattern_heatmap,
    scale_colorbar,
    set_title,
)

Pooling = Literal["max", "sum"]
MAX_TOKENS = 512
"""The Recording page's pattern shows at most this many tokens (Long context shows all)."""
OVERVIEW_CELLS = 512
"""Cells a side of the pooled overview: about one per screen pixel of the figure."""


def recording_pattern(rec: Recording, prompt: int, layer: int, head: int,
                      scale: ColourScale | None = "linear",
                      max_tokens: int = MAX_TOKENS) -> go.Figure:
    """One head's attention on one prompt, queries down and keys across, token-labelled;
    a prompt longer than ``max_tokens`` shows its first ``max_tokens`` tokens."""
    length = rec.length(prompt)
    n = min(length, max_tokens)
    title = f"layer {layer}, head {head} (L{layer}H{head})"
    if n < length:
        title += f": first {n} of {length} tokens (Long context shows them all)"
    pattern = rec.pattern(prompt, layer, head, queries=(0, n), keys=(0, n))
    return pattern_heatmap(pattern, rec.tokens(prompt)[:n], title, scale or "linear")


def pooled_heatmap(pooled: Pooled, tokens: Sequence[str], title: str,
                   scale: ColourScale | None) -> go.Figure:
    """A pooled grid drawn in token coordinates (cell centres), so a box drawn on it reads
    as token positions; a window of single tokens is drawn on axes of token labels."""
    q0, q1, k0, k1 = pooled.window
    f, grid = pooled.factor, pooled.grid
    top = 1 if pooled.how == "max" else None
    heat = go.Heatmap(z=grid, colorscale=colour_stops(scale), zmin=0, zmax=top,
                      colorbar=scale_colorbar(scale, pooled.how), **hidden_bar(scale))
    if f == 1:
        # categorical axes of "position 'token'": labels and hover with no per-cell data
        def names(a: int, b: int) -> list[str]:
            return [f"{i} {tokens[i]!r}"[:20] for i in range(a, b)]

        heat.update(x=names(k0, k1), y=names(q0, q1),
                    hovertemplate="query %{y}<br>key %{x}<br>weight %{z:.4f}<extra></extra>")
        axes: dict[str, Any] = {"xaxis": {"title": "key", "tickangle": -60, "nticks": 32},
                "yaxis": {"title": "query", "autorange": "reversed", "nticks": 32}}
    else:
        heat.update(x=k0 + (np.arange(grid.shape[1]) + 0.5) * f - 0.5,
                    y=q0 + (np.arange(grid.shape[0]) + 0.5) * f - 0.5,
                    hovertemplate=f"queries %{{y:.0f}} ± {f // 2}<br>keys %{{x:.0f}} ± "
                                  f"{f // 2}<br>{pooled.how} %{{z:.4f}}<extra></extra>")
        axes = {"xaxis": {"title": "key"}, "yaxis": {"title": "query", "autorange": "reversed"}}
    fig = go.Figure(heat)
    if scale == "log":  # the colours span 0 to the grid's top when no top is fixed
        fig.add_trace(log_colour_bar(pooled.how, top or float(np.nanmax(grid))))
    fig.update_layout(height=660, width=700, margin={"l": 10, "r": 10, "b": 10}, **axes)
    return set_title(fig, title, size=13)


def edge_segment(window: int | None, view: tuple[int, int, int, int]
                 ) -> tuple[int, int, int, int] | None:
    """Where a sliding window's edge crosses the view ``(q0, q1, k0, k1)``: the keys
    ``k = q - (window - 1)``, the oldest a query ``q`` still sees, as ``(q_first, k_first,
    q_last, k_last)``; ``None`` for a global layer (no window) or an edge outside the view.
    Every key left of the edge carries exactly zero weight."""
    if window is None:
        return None
    q0, q1, k0, k1 = view
    reach = window - 1
    first, last = max(q0, k0 + reach), min(q1 - 1, k1 - 1 + reach)
    if first > last:
        return None
    return first, first - reach, last, last - reach


def mark_edge(fig: go.Figure, window: int | None, pooled: Pooled) -> str:
    """Draw the edge of a sliding layer's ``window`` on a heatmap of ``pooled``, and say so
    in a few words for the title (empty for a global layer, ``window`` ``None``)."""
    if window is None:
        return ""
    segment = edge_segment(window, pooled.window)
    where = "" if segment is not None else " (outside this view)"
    if segment is not None:
        q_a, k_a, q_b, k_b = segment
        q0, _, k0, _ = pooled.window
        if pooled.factor == 1:  # categorical axes: positions counted from the view's start
            q_a, q_b, k_a, k_b = q_a - q0, q_b - q0, k_a - k0, k_b - k0
        fig.add_shape(type="line", x0=k_a - 0.5, y0=q_a, x1=k_b - 0.5, y1=q_b,
                      line={"color": "#dc2626", "dash": "dash", "width": 1.5},
                      name="window edge")
    return (f"<br>sliding layer: each query sees its last {window} keys; the dashed line is "
            f"the window's edge{where}, and every key left of it has weight 0")


def pooling_note(pooled: Pooled) -> str:
    """What one cell of ``pooled`` holds, in words."""
    f = pooled.factor
    return "1 token a cell" if f == 1 else f"{pooled.how} pooling of {f} x {f} tokens a cell"


def long_overview(rec: Recording, prompt: int, layer: int, head: int,
                  pooling: Pooling = "max", scale: ColourScale | None = "log",
                  cells: int = OVERVIEW_CELLS) -> go.Figure:
    """One head's whole pattern on one prompt, pooled to at most ``cells`` x ``cells``
    (``max`` or ``sum`` of each block of tokens) before the figure is made, with a sliding
    layer's window edge marked: the Long context page's overview."""
    pooled = rec.pooled(prompt, layer, head, max_cells=cells, how=pooling)
    n = rec.length(prompt)
    left = " (the left-out top-k mass is in no cell)" if rec.patterns == "topk" else ""
    title = (f"L{layer}H{head}, whole pattern, {n} tokens: {pooling_note(pooled)}{left}"
             "<br>drag a box to open it as a window")
    fig = pooled_heatmap(pooled, rec.tokens(prompt), title, scale)
    return set_title(fig, title + mark_edge(fig, rec.model.window(layer), pooled), size=13)


def received_strip(rec: Recording, prompt: int, layer: int, head: int,
                   pooling: Pooling = "max", cells: int = OVERVIEW_CELLS) -> go.Figure:
    """The attention each key of one prompt receives from every query (the pattern's
    column sums, :meth:`Recording.received`), pooled to at most ``cells`` bars (``max`` or
    ``sum`` of each run of keys): the strip under the Long context page's overview. Exact
    from a ``qk`` or dense recording; from a ``topk`` one it counts the kept weights only,
    and its title says so."""
    received = rec.received(prompt, layer, head)
    n = len(received)
    factor = sparse.cells(n, cells)
    bars = sparse.pool_dense(received[None, :], factor, pooling)[0] if factor > 1 else received
    what = "1 key a bar" if factor == 1 else f"{pooling} of {factor} keys a bar"
    bound = ": top-k kept weights only, a lower bound" if rec.patterns == "topk" else ""
    fig = go.Figure(go.Bar(x=np.arange(len(bars)) * factor, y=bars, width=factor,
                           offset=0, marker_line_width=0, name="received",
                           hovertemplate="keys %{x}..: %{y:.4g}<extra></extra>"))
    fig.update_xaxes(title="key position", range=[0, n])
    fig.update_yaxes(title="received (sum over queries)")
    title = f"L{layer}H{head}: attention each key receives, {what}{bound}"
    return set_title(fig, title, size=13)


def _check_scale(scale: object) -> None:
    if scale not in COLOUR_SCALES:
        raise WorkbenchError(f"colour scale must be one of {', '.join(COLOUR_SCALES)}, "
                             f"got {scale!r}")


def show_pattern(rec: Recording, prompt: int, layer: int, head: int, *,
                 scale: ColourScale = "linear", max_tokens: int = MAX_TOKENS) -> go.Figure:
    """One head's attention on one prompt as the Recording page draws it: queries down,
    keys across, each axis labelled with the tokens (the first ``max_tokens``).

    Examples:
        >>> workbench.show_pattern(rec, 0, layer=1, head=2, scale="log")  # doctest: +SKIP

    Raises:
        WorkbenchError: a prompt, layer or head the recording does not have, a recording
            without patterns, or an unknown colour scale.
    """
    _check_scale(scale)
    rec.check_head(prompt, layer, head)
    return recording_pattern(rec, prompt, layer, head, scale, max_tokens)


def show_long(rec: Recording, prompt: int, layer: int, head: int, pooling: Pooling = "max",
              *, scale: ColourScale = "log", cells: int = OVERVIEW_CELLS) -> go.Figure:
    """One head's whole pattern as the Long context page's overview draws it: pooled
    (:meth:`~workbench.recording.reader.Recording.pooled`, ``max`` or ``sum`` of each block
    of tokens) to at most ``cells`` a side before the figure is made, so an 8,192-token
    prompt gives a 512 x 512 figure; a sliding layer's window edge is marked.

    Examples:
        >>> workbench.show_long(rec, 0, layer=1, head=2, pooling="max")   # doctest: +SKIP

    Raises:
        WorkbenchError: as :func:`show_pattern`, or a pooling other than max or sum.
    """
    _check_scale(scale)
    if pooling not in ("max", "sum"):
        raise WorkbenchError(f"pooling must be max or sum, got {pooling!r}")
    if not 1 <= cells <= 4096:
        raise WorkbenchError(f"cells must be between 1 and 4096, got {cells!r}")
    rec.check_head(prompt, layer, head)
    return long_overview(rec, prompt, layer, head, pooling, scale, cells)


def query_bars(weights: np.ndarray, tokens: list[str], query: int, name: str) -> go.Figure:
    """The chosen query's attention over the keys."""
    fig = go.Figure(go.Bar(x=[f"{k}: {t!r}"[:24] for k, t in enumerate(tokens)], y=weights,
                           hovertemplate="key %{x}<br>weight %{y:.3f}<extra></extra>"))
    fig.update_layout(title=f"{name}: where query {query} {tokens[query]!r} attends",
                      height=360, yaxis={"title": "weight", "range": [0, 1]},
                      xaxis={"title": "key", "tickangle": -60},
                      margin={"l": 10, "r": 10, "t": 50, "b": 10})
    return fig


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
        block = rec.pattern(prompt, layer, queries=(0, n), keys=(0, n))  # reads n rows
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
               "ticktext": layer_labels(rec.model.layer_types)},
    )
    # the heads' numbers sit on top, so the title needs room above them
    return set_title(fig, f"all heads: layers down, heads across (first {n} tokens); click "
                          "one to open it", above=20)
