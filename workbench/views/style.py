"""What every figure shares, the dashboard's and a notebook's: a colour scale that can be
linear, log or power, discrete colours for discrete values, titles wrapped onto lines that
fit the figure, and the two heatmaps most views draw: one head's attention pattern and a
layer x head grid of scores.

Examples:
    >>> import numpy as np
    >>> fig = pattern_heatmap(np.eye(3), ["a", "b", "c"], "L0H0")
    >>> fig.data[0].x[0]
    "0: 'a'"
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from typing import Literal, get_args

import numpy as np
import pandas as pd
import plotly.colors
import plotly.graph_objects as go
from jaxtyping import Float

ColourScale = Literal["linear", "log", "power"]
COLOUR_SCALES: tuple[str, ...] = get_args(ColourScale)
LOG_FLOOR = 1e-4
"""On the log scale every weight below this fraction of the scale's top is the lightest
colour: four decades, which shows a head's spread beside a first-token weight near 1."""
POWER = 0.5
"""The power scale colours ``z ** POWER``: small weights lifted, less than on the log scale."""
STOPS = 11
TITLE_CHARS = 80
"""Characters a title line holds in a figure of about 700 pixels."""
MAX_DISCRETE = 16
"""Whole-number values with at most this many levels get one colour a level."""


def colour_stops(scale: ColourScale | None, base: str = "Blues") -> list[list]:
    """A Plotly colorscale that paints ``base`` on a linear, log or power scale.

    The figure's ``z`` stays the weights themselves (hover and exports read true values);
    only where the colours sit between ``zmin`` and ``zmax`` changes: on the log scale the
    colour ``c`` is at the fraction ``LOG_FLOOR ** (1 - c)`` of the range, on the power
    scale at ``c ** (1 / POWER)``. ``None`` is the linear scale.
    """
    scale = scale or "linear"
    if scale not in COLOUR_SCALES:
        raise ValueError(f"colour scale must be one of {', '.join(COLOUR_SCALES)}, got {scale!r}")
    levels = np.linspace(0, 1, STOPS)
    colours = plotly.colors.sample_colorscale(base, levels.tolist())
    if scale == "linear":
        return [[float(at), c] for at, c in zip(levels, colours, strict=True)]
    if scale == "power":
        return [[float(at), c] for at, c in zip(levels ** (1 / POWER), colours, strict=True)]
    at = LOG_FLOOR ** (1 - levels)
    return [[0.0, colours[0]]] + [[float(a), c] for a, c in zip(at, colours, strict=True)]


def scale_colorbar(scale: ColourScale | None, title: str) -> dict:
    """The colour bar of a heatmap painted by :func:`colour_stops`, its title naming the
    scale. Its axis is linear in the weight; on the log scale the heatmap hides it and
    :func:`log_colour_bar` draws one ticked at the weights instead."""
    return {"title": title if scale in (None, "linear") else f"{title} ({scale})"}


def hidden_bar(scale: ColourScale | None) -> dict:
    """``showscale=False`` for a heatmap on the log scale (its bar is
    :func:`log_colour_bar`'s), nothing for the others (their own bar is right)."""
    return {"showscale": False} if scale == "log" else {}


def log_colour_bar(title: str, top: float, base: str = "Blues") -> go.Scatter:
    """The colour bar of a heatmap painted on the log scale (:func:`colour_stops`, from
    0 to ``top``), as a trace with no points: a bar laid out by the colours, one tick a
    decade from ``LOG_FLOOR * top`` to ``top``, each labelled with the weight whose
    colour sits beside it (a bar linear in the weight puts every decade but the last in
    its lowest tenth).

    Examples:
        >>> log_colour_bar("weight", 1.0).marker.colorbar.ticktext
        ('0.0001', '0.001', '0.01', '0.1', '1')
    """
    low = float(np.log10(LOG_FLOOR))
    decades = np.arange(round(low), 1)
    # colour c sits at the fraction LOG_FLOOR ** (1 - c): linear in log10 of the fraction
    return go.Scatter(
        x=[None], y=[None], mode="markers", name="colour bar", showlegend=False,
        hoverinfo="skip",
        marker={"color": [low, 0.0], "cmin": low, "cmax": 0.0, "showscale": True,
                "colorscale": colour_stops("linear", base),
                "colorbar": {"title": f"{title} (log)", "tickvals": decades.tolist(),
                             "ticktext": [f"{top * 10.0 ** d:.2g}" for d in decades]}})


def discrete_levels(values: np.ndarray) -> list[int] | None:
    """The levels of a grid of whole numbers with at most ``MAX_DISCRETE`` of them, from
    the lowest to the highest (every whole number between); ``None`` for any other grid."""
    finite = values[np.isfinite(values)]
    if finite.size == 0 or not np.all(finite == np.round(finite)):
        return None
    low, high = int(finite.min()), int(finite.max())
    if high - low + 1 > MAX_DISCRETE:
        return None
    return list(range(low, high + 1))


def discrete_colours(levels: Sequence[int], base: str = "Viridis") -> list[list]:
    """A stepped colorscale, one flat band of ``base`` a level, for ``zmin = levels[0] -
    0.5`` and ``zmax = levels[-1] + 0.5`` (each level at the centre of its band)."""
    n = len(levels)
    colours = plotly.colors.sample_colorscale(base, [i / max(1, n - 1) for i in range(n)])
    stops: list[list] = []
    for i, colour in enumerate(colours):
        stops += [[i / n, colour], [(i + 1) / n, colour]]
    return stops


def wrapped(title: str, width: int = TITLE_CHARS) -> str:
    """``title`` with a line break wherever a line would pass ``width`` characters (the
    line breaks it has are kept), so Plotly never cuts it off at the figure's edge."""
    lines = []
    for part in title.split("<br>"):
        lines.extend(textwrap.wrap(part, width, break_long_words=False,
                                   break_on_hyphens=False) or [""])
    return "<br>".join(lines)


def set_title(fig: go.Figure, title: str, width: int = TITLE_CHARS, size: int = 14,
              above: int = 0) -> go.Figure:
    """Give ``fig`` the wrapped ``title`` and a top margin tall enough for all its lines,
    plus ``above`` pixels for what sits between the title and the plot."""
    text = wrapped(title, width)
    lines = text.count("<br>") + 1
    fig.update_layout(title={"text": text, "font": {"size": size}},
                      margin={"t": 30 + int(size * 1.35) * lines + above})
    return fig


def with_interventions(fig: go.Figure, interventions: str) -> go.Figure:
    """``fig`` with the run's interventions in a few words (``Run.interventions_text``)
    as its title's last line, so a figure of a head-masked run never reads as a clean
    run's; ``""``, or a title that already ends with them, leaves it as it is."""
    title = fig.layout.title
    old = title.text or ""
    if not interventions or old.replace("<br>", " ").endswith(interventions):
        return fig
    size = int(title.font.size or 14)
    return set_title(fig, f"{old}<br>{interventions}" if old else interventions, size=size)


def unique_labels(tokens: Sequence[str]) -> list[str]:
    """Axis labels must be unique, so each token gets its position."""
    return [f"{i}: {t!r}"[:24] for i, t in enumerate(tokens)]


def pattern_heatmap(pattern: Float[np.ndarray, "query key"], tokens: Sequence[str],
                    title: str, scale: ColourScale = "linear") -> go.Figure:
    """One head's attention: rows are queries, columns are keys, labelled with tokens,
    coloured on a ``linear``, ``log`` or ``power`` scale (:func:`colour_stops`)."""
    labels = unique_labels(tokens)
    fig = go.Figure(go.Heatmap(
        z=pattern, x=labels, y=labels, colorscale=colour_stops(scale), zmin=0, zmax=1,
        hovertemplate="query %{y}<br>key %{x}<br>weight %{z:.4f}<extra></extra>",
        colorbar=scale_colorbar(scale, "weight"), **hidden_bar(scale),
    ))
    if scale == "log":
        fig.add_trace(log_colour_bar("weight", 1.0))
    side = min(900, 160 + 14 * len(tokens))
    fig.update_layout(height=side + 80, margin={"l": 10, "r": 10, "b": 10},
                      xaxis={"title": "key", "tickangle": -60, "side": "bottom"},
                      yaxis={"title": "query", "autorange": "reversed"})
    return set_title(fig, title)


def layer_labels(layer_types: Sequence[str]) -> list[str]:
    """Each layer's label on a figure's layer axis: its number, with ``global`` beside
    the global layers of a model that also has sliding-window layers (gemma3's 5, 11 and
    17 among 15 sliding ones); numbers alone for a model whose layers are all alike.

    Examples:
        >>> layer_labels(["sliding", "global", "sliding"])
        ['0', '1 global', '2']
        >>> layer_labels(["global", "global"])
        ['0', '1']
    """
    mixed = "sliding" in layer_types
    return [f"{i} global" if mixed and kind == "global" else str(i)
            for i, kind in enumerate(layer_types)]


def head_heatmap(scores: pd.DataFrame, metric: str, *, title: str | None = None,
                 zmin: float | None = None, zmax: float | None = None,
                 colorscale: str = "Viridis",
                 layer_types: Sequence[str] | None = None) -> go.Figure:
    """A layer x head heatmap of one metric from a long-format ``head_scores`` table.

    Hover shows the score and, when the table has them, its 95% interval. Click data
    carries ``x`` = head and ``y`` = layer. With the model's ``layer_types``, a model's
    global layers among sliding-window ones are labelled so (:func:`layer_labels`).
    """
    df = scores[scores.metric == metric]
    n_layers, n_heads = int(df["layer"].max()) + 1, int(df["head"].max()) + 1
    grid = np.full((n_layers, n_heads), np.nan)
    low = np.full_like(grid, np.nan)
    high = np.full_like(grid, np.nan)
    cells = df["layer"].to_numpy(), df["head"].to_numpy()
    grid[cells] = df.score.to_numpy()
    if "ci_low" in df.columns:
        low[cells], high[cells] = df.ci_low.to_numpy(), df.ci_high.to_numpy()
    hover = "L%{y}H%{x}<br>" + metric + " = %{z:.3f}"
    if "ci_low" in df.columns:
        hover += "<br>95% CI [%{customdata[0]:.3f}, %{customdata[1]:.3f}]"
    bar: dict = {"title": metric}
    levels = discrete_levels(grid)
    scale: str | list[list] = colorscale
    if levels is not None:  # whole numbers (a kept/pruned mask, a step): one colour each
        scale = discrete_colours(levels, colorscale)
        zmin, zmax = levels[0] - 0.5, levels[-1] + 0.5
        bar.update(tickvals=levels, ticktext=[str(v) for v in levels])
        hover = hover.replace("%{z:.3f}", "%{z:.0f}")
    fig = go.Figure(go.Heatmap(
        z=grid, x=list(range(n_heads)), y=list(range(n_layers)),
        customdata=np.stack([low, high], axis=-1), zmin=zmin, zmax=zmax,
        colorscale=scale, hovertemplate=hover + "<extra></extra>", colorbar=bar,
    ))
    # the axes span the grid's cells and no more: marks drawn over it (outlined heads)
    # would otherwise pad an autorange by 5% a side, a row and a half on 30 layers
    fig.update_layout(height=min(900, 160 + 22 * n_layers),
                      margin={"l": 10, "r": 10, "b": 10},
                      xaxis={"title": "head", "dtick": 1, "range": [-0.5, n_heads - 0.5],
                             "autorange": False},
                      yaxis={"title": "layer", "dtick": 1, "range": [n_layers - 0.5, -0.5],
                             "autorange": False})
    if layer_types is not None and "sliding" in layer_types:
        fig.update_yaxes(tickvals=list(range(n_layers)),
                         ticktext=layer_labels(layer_types)[:n_layers])
    return set_title(fig, title or metric, width=60)


def pattern_from_rows(rows: pd.DataFrame, n_tokens: int) -> Float[np.ndarray, "query key"]:
    """One head's pattern stored as long rows (``query, key, weight``; e.g. only the lower
    triangle a causal query can see) as a full ``[query, key]`` matrix, zeros elsewhere."""
    grid = np.zeros((n_tokens, n_tokens))
    grid[rows["query"].to_numpy(), rows["key"].to_numpy()] = rows["weight"].to_numpy()
    return grid
