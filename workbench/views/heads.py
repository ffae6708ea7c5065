"""The Heads page's figures: one metric's layer x head heatmap with each head's 95% interval
on hover, on the colour range of every heatmap shown beside it, the difference of two
runs' heatmaps, and an ``induction-heads`` run's evidence: the loss on a repeated
sequence, in-context learning by position, the ablations and the path patch.

Examples:
    >>> import pandas as pd
    >>> scores = pd.DataFrame({"layer": [0, 0], "head": [0, 1], "metric": "induction",
    ...                        "score": [0.1, 0.9]})
    >>> head_scores_figure(scores, "induction", "tiny", "induction-heads").data[0].zmax
    0.9
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from workbench.views.style import head_heatmap, set_title

MARGIN = {"l": 10, "r": 10, "t": 60, "b": 10}
MARK_COLOUR = "#e11d48"
"""The outline of a head in a class (:func:`outline_heads`)."""


def shared_range(frames: list[pd.DataFrame], metric: str) -> tuple[float, float] | None:
    """One colour scale for every heatmap of ``metric`` shown side by side: the lowest
    and highest score of any of ``frames`` (``None`` when none has the metric)."""
    scores = pd.concat([f.score[f.metric == metric] for f in frames]).dropna()
    if scores.empty:
        return None
    return float(scores.min()), float(scores.max())


def head_scores_figure(scores: pd.DataFrame, metric: str, model: str | None, experiment: str,
                       meaning: str | None = None,
                       zrange: tuple[float, float] | None = None) -> go.Figure:
    """One metric of a long-format ``head_scores`` table as a layer x head heatmap.

    Args:
        scores: rows ``layer, head, metric, score`` (``ci_low, ci_high`` shown on hover).
        metric: the metric drawn.
        model: the run's model, for the title.
        experiment: the run's experiment, for the title.
        meaning: the metric's meaning, a second title line.
        zrange: the colour range; default the metric's own lowest and highest score.
    """
    low, high = zrange or shared_range([scores], metric) or (None, None)
    title = f"{metric} · {model} · {experiment}"
    if meaning:
        title += f"<br><sup>{meaning}</sup>"
    return head_heatmap(scores, metric, title=title, zmin=low, zmax=high)


def difference_figure(scores: pd.DataFrame, other: pd.DataFrame, metric: str,
                      title: str) -> go.Figure:
    """This run's score minus the compared run's, head by head, on a scale centred on 0."""
    mine = scores[scores.metric == metric].set_index(["layer", "head"]).score
    theirs = other[other.metric == metric].set_index(["layer", "head"]).score
    diff = (mine - theirs).dropna().rename("score").reset_index().assign(metric=metric)
    bound = float(np.abs(diff.score).max()) or 1.0
    return head_heatmap(diff, metric, title=title, zmin=-bound, zmax=bound,
                                colorscale="RdBu")


def repeat_loss_figure(repeat: pd.DataFrame) -> go.Figure:
    """Next-token loss on each repeat of the random sequences, with its 95% interval."""
    repeat = repeat.sort_values("repeat")
    fig = go.Figure(go.Scatter(
        x=repeat["repeat"], y=repeat.loss, mode="lines+markers", name="loss",
        error_y={"type": "data", "symmetric": False, "array": repeat.ci_high - repeat.loss,
                 "arrayminus": repeat.loss - repeat.ci_low},
        hovertemplate="repeat %{x}: %{y:.3f} nats<extra></extra>"))
    fig.update_layout(title=f"loss on each repeat ({int(repeat.n_prompts.iloc[0])} repeated "
                            "random sequences)",
                      xaxis={"title": "repeat (1 = first occurrence)", "dtick": 1},
                      yaxis={"title": "next-token loss (nats)", "rangemode": "tozero"},
                      height=420, margin=MARGIN)
    return fig


def icl_figure(by_position: pd.DataFrame, icl: pd.DataFrame) -> go.Figure:
    """Loss against position in the natural-text windows, with the two positions the
    in-context-learning score compares marked, and the score in the title."""
    by_position = by_position.sort_values("position")
    fig = go.Figure(go.Scatter(x=by_position.position, y=by_position.loss, mode="lines",
                               name="mean loss", line={"color": "#2563eb"}))
    exact = icl[icl.metric == "icl_score"]
    if len(exact):
        row = exact.iloc[0]
        fig.add_scatter(x=[50, 500], y=[row.loss_at_50, row.loss_at_500], mode="markers",
                        name="positions 50 and 500", marker={"size": 10, "color": "#dc2626"})
    scores = [f"{r.metric} {r.value:.3f} [{r.ci_low:.3f}, {r.ci_high:.3f}]"
              for r in icl.itertuples()]
    fig.update_layout(xaxis={"title": "position"}, yaxis={"title": "loss (nats)"},
                      height=420, margin=MARGIN)
    # a score a line: on one line the two scores ran past a half-width figure's edge
    return set_title(fig, "<br>".join(["in-context learning", *scores]), width=ICL_CHARS)


ICL_CHARS = 50
"""Characters a title line of the ICL figure holds: it shares a row with the repeat loss,
each figure at least 28em (448 px) wide."""


ABLATION_PANELS = (("induction_tracked", "tracked heads' induction score"),
                   ("second_repeat_loss", "second-repeat loss (nats)"))


KIND_COLOURS = {"zero": "#2563eb", "mean": "#059669"}


def ablation_figure(ablation: pd.DataFrame) -> go.Figure:
    """The K-composition test: the tracked induction heads' score and the second-repeat
    loss, clean (dashed line), with the previous-token heads ablated, and with random
    same-layer heads ablated (mean of the draws; the bar spans the lowest to the highest)."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=[t for _, t in ABLATION_PANELS])
    clean = ablation[ablation.condition == "clean"]
    for col, (column, _) in enumerate(ABLATION_PANELS, start=1):
        for kind, rows in ablation[ablation.condition != "clean"].groupby("kind", sort=False):
            stats = rows.groupby("condition", sort=False)[column].agg(["mean", "min", "max"])
            fig.add_bar(x=stats.index, y=stats["mean"], name=f"{kind} ablation",
                        marker_color=KIND_COLOURS.get(str(kind)), showlegend=col == 1,
                        legendgroup=str(kind),
                        error_y={"type": "data", "symmetric": False,
                                 "array": stats["max"] - stats["mean"],
                                 "arrayminus": stats["mean"] - stats["min"]},
                        row=1, col=col)
        if len(clean):
            # plotly annotates add_hline's row and col as str, from their default "all"
            fig.add_hline(y=float(clean[column].iloc[0]), line_dash="dash",
                          line_color="#6b7280", annotation_text="clean",
                          row=1, col=col)  # pyright: ignore[reportArgumentType]
    heads = ablation[ablation.condition == "previous-token"].heads
    tracked = ablation.tracked.iloc[0] if len(ablation) else "-"
    fig.update_layout(barmode="group", height=440, margin={**MARGIN, "t": 90},
                      title=f"K-composition: previous-token heads "
                            f"{heads.iloc[0] if len(heads) else '-'} ablated; tracked "
                            f"induction heads {tracked}")
    return fig


PATHS = ("key", "query", "value")


PATH_PANELS = (("induction_tracked", "tracked heads' induction score"),
               ("second_repeat_loss", "second-repeat loss (nats)"))
PANEL_LEGENDS = ("legend", "legend2")
"""Each panel of the path patch lists what it draws in a legend of its own, under it: the
random draws' loss is not measured, and one legend beside the loss panel listed them."""


def _random_draws(rows: pd.DataFrame, column: str, col: int, fig: go.Figure) -> None:
    """The random draws of each path: their mean as a bar spanning the lowest to the
    highest draw, and every draw as a point over it."""
    stats = rows.groupby("path", sort=False)[column].agg(["mean", "min", "max", "count"])
    stats = stats.reindex([p for p in PATHS if p in stats.index])
    fig.add_bar(x=stats.index, y=stats["mean"], name="random same-layer heads (mean)",
                marker_color="#9ca3af", legend=PANEL_LEGENDS[col - 1], legendgroup="random",
                error_y={"type": "data", "symmetric": False, "array": stats["max"] - stats["mean"],
                         "arrayminus": stats["mean"] - stats["min"]},
                customdata=stats["count"],
                hovertemplate="%{x}: mean %{y:.3f} over %{customdata} draws<extra></extra>",
                row=1, col=col)
    fig.add_scatter(x=rows.path, y=rows[column], mode="markers", name="one random draw",
                    marker={"color": "#4b5563", "size": 5}, legend=PANEL_LEGENDS[col - 1],
                    legendgroup="draws", hovertemplate="%{x}: %{y:.3f}<extra></extra>",
                    row=1, col=col)


def path_patch_figure(patch: pd.DataFrame) -> go.Figure:
    """The path patch: the tracked induction heads' score and the second-repeat loss with
    the previous-token heads removed from only their key, query or value input, beside the
    same removal of random same-layer heads (every draw, and their mean and range), and
    clean (dashed line). The second-repeat loss is measured for the previous-token heads
    only; the random draws' control is on the score."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=[t for _, t in PATH_PANELS])
    clean = patch[patch.condition == "clean"]
    ours = patch[patch.condition == "previous-token"].set_index("path").reindex(
        [p for p in PATHS if p in set(patch.path)])
    draws = patch[patch.condition == "random"]
    for col, (column, _) in enumerate(PATH_PANELS, start=1):
        fig.add_bar(x=ours.index, y=ours[column], name="previous-token heads",
                    marker_color="#dc2626", legend=PANEL_LEGENDS[col - 1], legendgroup="prev",
                    hovertemplate="%{x}: %{y:.3f}<extra></extra>", row=1, col=col)
        if draws[column].notna().any():
            _random_draws(draws.dropna(subset=[column]), column, col, fig)
        if len(clean):
            # plotly annotates add_hline's row and col as str, from their default "all"
            fig.add_hline(y=float(clean[column].iloc[0]), line_dash="dash",
                          line_color="#6b7280", annotation_text="clean",
                          row=1, col=col)  # pyright: ignore[reportArgumentType]
    heads = ours.heads.iloc[0] if len(ours) else "-"
    tracked = patch.tracked.iloc[0] if len(patch) else "-"
    n_draws = draws.draw.nunique()
    fig.update_layout(barmode="group", height=540, margin={**MARGIN, "b": 100})
    fig.update_xaxes(title_text="the one input of the tracked heads patched")
    axes = fig.to_plotly_json()["layout"]
    under = [{"orientation": "h", "x": axes[axis]["domain"][0], "xanchor": "left",
              "y": -0.2, "yanchor": "top"} for axis in ("xaxis", "xaxis2")]
    fig.update_layout(legend=under[0], legend2=under[1])  # PANEL_LEGENDS, under each panel
    # the panels' own titles sit above them, in the top margin too
    return set_title(fig, f"path patch: previous-token heads "
                          f"{heads if heads != '-' else 'none'} removed from only the key, "
                          f"query or value input of the tracked induction heads {tracked}, "
                          f"against {n_draws} random draws of same-layer heads",
                     width=110, above=30)


def outline_heads(fig: go.Figure, heads: pd.DataFrame, name: str, rate: float) -> None:
    """Outline ``heads`` (rows ``layer, head, q``: the heads in class ``name`` at
    false-discovery rate ``rate``) on ``fig``, a layer x head heatmap, each with its q on
    hover."""
    fig.add_scatter(
        x=heads["head"], y=heads["layer"], customdata=heads.q, mode="markers",
        name=f"{name} at FDR {rate:g}", showlegend=False,
        marker={"symbol": "square-open", "size": 16, "color": MARK_COLOUR,
                "line": {"width": 2, "color": MARK_COLOUR}},
        hovertemplate=f"L%{{y}}H%{{x}}<br>{name}, q = %{{customdata:.3g}}<extra></extra>")
