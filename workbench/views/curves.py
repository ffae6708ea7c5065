"""Curves of a run's tables as the Pruning and Formation pages draw them: a metric against
the fraction of heads pruned, and loss and in-context learning against tokens seen.

Examples:
    >>> run = RunStore("data/runs").latest(experiment="head-pruning")   # doctest: +SKIP
    >>> pruning_curves(run.table("pruning_curve"), "loss", run.model_name)  # doctest: +SKIP
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

LINE_COLOURS = {"gradient": "#2563eb", "ablation": "#059669", "reverse-gradient": "#dc2626",
                "reverse-ablation": "#d97706"}
"""The colour of each importance order's line (random orders are a grey band)."""
WINDOW_COLOUR = "rgba(234, 179, 8, 0.25)"
"""The shade of a phase-change window."""


def pruning_curves(curve: pd.DataFrame, metric: str, model: str) -> go.Figure:
    """The metric against the fraction pruned: one line per importance order, and the
    random orders as their mean with a band from the lowest to the highest seed."""
    rows = curve[curve.metric == metric]
    fig = go.Figure()
    rand = rows[rows.order == "random"].groupby("fraction_pruned").value
    if len(rand):
        stats = pd.DataFrame({"low": rand.min(), "high": rand.max(), "mean": rand.mean()})
        x = stats.index.to_numpy()
        fig.add_scatter(x=x, y=stats.high, name="random max", mode="lines",
                        line={"width": 0}, showlegend=False, hoverinfo="skip")
        fig.add_scatter(x=x, y=stats.low, name="random band", mode="lines",
                        line={"width": 0}, fill="tonexty", fillcolor="rgba(107,114,128,0.25)")
        fig.add_scatter(x=x, y=stats["mean"], name="random mean",
                        mode="lines+markers", line={"color": "#6b7280", "dash": "dash"})
    for key, group in rows[rows.order != "random"].groupby("order", sort=False):
        order = str(key)
        group = group.sort_values("fraction_pruned")
        fig.add_scatter(x=group.fraction_pruned, y=group.value, name=order,
                        mode="lines+markers", line={"color": LINE_COLOURS.get(order)},
                        customdata=np.stack([group.ci_low, group.ci_high], axis=-1),
                        hovertemplate="%{x:.0%} pruned<br>" + metric + " = %{y:.4f}"
                                      "<br>95% CI [%{customdata[0]:.4f}, "
                                      "%{customdata[1]:.4f}]<extra>" + order + "</extra>")
    n_seeds = rows[rows.order == "random"].seed.nunique()
    fig.update_layout(title=f"{metric} vs fraction of heads pruned · {model} "
                            f"(random: {n_seeds} seeds)",
                      height=480, margin={"l": 10, "r": 10, "t": 50, "b": 10},
                      xaxis={"title": "fraction of heads pruned", "tickformat": ".0%"},
                      yaxis={"title": metric})
    return fig


def shade_window(fig: go.Figure, phase: pd.Series, tokens_per_step: float | None) -> None:
    """Shade the phase-change window of a ``phase_change`` row (nothing if none was found),
    in steps, or in tokens seen when ``tokens_per_step`` is given."""
    if not bool(phase.detected):
        return
    scale = tokens_per_step or 1.0
    fig.add_vrect(x0=phase.start_step * scale, x1=phase.end_step * scale,
                  fillcolor=WINDOW_COLOUR, line_width=0, layer="below",
                  annotation_text="phase change", annotation_position="top left")


def formation_curves(curve: pd.DataFrame, phase: pd.Series, model: str) -> go.Figure:
    """Held-out and training loss and the ICL score against tokens seen, every model of the
    run (``model`` solid, the others dotted), ``model``'s phase-change window shaded.

    Args:
        curve: the run's ``training_curve`` table.
        phase: ``model``'s row of the run's ``phase_change`` table.
        model: the model drawn solid.
    """
    curve = curve.sort_values(["n_layers", "step"])
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=("loss (nats)", "in-context learning score "
                                        "(late minus early loss; lower is more ICL)"))
    for name, df in curve.groupby("model", sort=False):
        dash_style = None if name == model else "dot"
        fig.add_scatter(x=df.tokens, y=df.heldout_loss, name=f"{name} held-out loss",
                        mode="lines+markers", line={"dash": dash_style}, row=1, col=1)
        fig.add_scatter(x=df.tokens, y=df.train_loss, name=f"{name} training loss",
                        mode="lines", line={"dash": dash_style, "width": 1}, row=1, col=1)
        fig.add_scatter(x=df.tokens, y=df.icl_score, name=f"{name} ICL score",
                        mode="lines+markers", line={"dash": dash_style}, row=2, col=1)
    sel = curve[curve.model == model]
    per_step = float(sel.tokens.iloc[-1] / sel.step.iloc[-1]) if sel.step.iloc[-1] else None
    shade_window(fig, phase, per_step)
    fig.update_layout(title=f"loss and in-context learning against tokens seen · {model}",
                      height=620, margin={"l": 10, "r": 10, "t": 80, "b": 10})
    fig.update_xaxes(title_text="tokens seen", row=2, col=1)
    return fig


def formation_heads(scores: pd.DataFrame, phase: pd.Series, model: str) -> go.Figure:
    """Every head's induction and previous-token score over training for ``model`` (rows
    of the run's ``head_scores`` table), its phase-change window shaded."""
    scores = scores[scores.model == model].sort_values("step")
    fig = make_subplots(rows=1, cols=2, shared_yaxes=True, horizontal_spacing=0.05,
                        subplot_titles=("induction", "previous_token"))
    for col, metric in enumerate(("induction", "previous_token"), start=1):
        for (layer, head), df in scores[scores.metric == metric].groupby(["layer", "head"]):
            fig.add_scatter(x=df.step, y=df.score, name=f"L{layer}H{head} {metric}",
                            mode="lines", legendgroup=f"L{layer}H{head}",
                            hovertemplate=f"L{layer}H{head}<br>step %{{x}}<br>{metric} "
                                          "%{y:.3f}<extra></extra>", row=1, col=col)
        null = scores[scores.metric == metric].null.iloc[0]
        # plotly annotates add_hline's row and col as str, from their default "all"
        fig.add_hline(y=null, line_dash="dash", line_color="#888",
                      row=1, col=col,  # pyright: ignore[reportArgumentType]
                      annotation_text="uniform", annotation_position="bottom right")
    shade_window(fig, phase, None)
    fig.update_layout(title=f"every head's score over training · {model}", height=420,
                      margin={"l": 10, "r": 10, "t": 80, "b": 10}, showlegend=False)
    fig.update_xaxes(title_text="training step")
    fig.update_yaxes(range=[0, 1])
    return fig
