"""Layer x head figures of a run's scores as the Heads page draws them: one metric's heatmap
with each head's 95% interval on hover, on the colour range of every heatmap shown beside it.

Examples:
    >>> import pandas as pd
    >>> scores = pd.DataFrame({"layer": [0, 0], "head": [0, 1], "metric": "induction",
    ...                        "score": [0.1, 0.9]})
    >>> head_scores_figure(scores, "induction", "tiny", "induction-heads").data[0].zmax
    0.9
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from workbench.views.style import head_heatmap


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
