"""Attention sinks: alpha_1 per head, sink rates by input, where the attention mass goes,
massive activations by layer, and perplexity when the sink is evicted (attention-sinks).

Everything shown is read from the run's tables, by the names declared in
``experiments/attention_sinks/tables.py``; a part the run skipped is explained from its
``skipped`` table.
"""

from __future__ import annotations

from typing import Annotated

import dash
import numpy as np
import pandas as pd
import plotly.graph_objects as go
from dash import Input, Output, callback, dash_table, dcc, html, no_update

from dashboards.components import data, exports, figures
from dashboards.components.controls import labelled
from dashboards.components.messages import safe, safe_layout
from dashboards.components.skeleton import run_page
from dashboards.components.values import Name, OneOf, RunId, among
from experiments.attention_sinks.tables import (
    HEAD_SCORES,
    INPUT_SCORES,
    MASSIVE_ACTIVATIONS,
    SINK_RATES,
    SKIPPED,
    STREAMING_LOSSES,
    STREAMING_PERPLEXITY,
    TOP_RECEIVERS,
)
from workbench.core.errors import WorkbenchError
from workbench.scores import metrics
from workbench.store.runs import Run
from workbench.views import pages

SHOWS = pages.shows("/sinks")
dash.register_page(__name__, path="/sinks", name="Sinks",
                   order=pages.order("/sinks"), experiments=SHOWS)

EMPTY = ("No attention-sinks runs yet. Make one with "
         "`workbench run attention-sinks --model smollm2`.")
MARGIN = {"l": 10, "r": 10, "t": 50, "b": 10}
TYPE_COLOURS = {"bos": "#1f2937", "cls": "#1f2937", "sep": "#b91c1c",
                "first_content": "#f59e0b", "newline": "#2563eb", "punctuation": "#10b981",
                "other": "#d1d5db"}
STREAMING_SHOWN = ["label", "variant", "n_sinks", "window", "ppl", "ppl_beyond_window",
                   "ppl_matched", "matched_low", "matched_high", "n_matched", "n_tokens"]
"""The columns of streaming_perplexity shown in the page's table, in this order."""
CURVES = ("running", "binned")
"""The two views of the streaming perplexity (``sinks-curve``)."""
HIDDEN = {"display": "none"}
ALPHA_1 = metrics.get("first_token").name
"""The metric the heatmap shows first."""


@safe_layout("Attention sinks")
def layout(run: str | None = None, **_: str) -> html.Div:
    return run_page("sinks", "Attention sinks", shows=SHOWS, requested=run, empty=EMPTY,
                    controls=[
        labelled("input", dcc.Dropdown(id="sinks-input", clearable=False), "16em"),
        labelled("heatmap metric", dcc.Dropdown(id="sinks-metric", clearable=False), "16em"),
    ], body=lambda chosen: [
        html.Ul(id="sinks-summary", className="wb-note"),
        html.Div(className="wb-row", children=[exports.graph("sinks-heatmap", chosen),
                                               exports.graph("sinks-rates", chosen)]),
        html.Div(className="wb-row", children=[exports.graph("sinks-mass", chosen),
                                               exports.graph("sinks-receivers", chosen)]),
        exports.graph("sinks-massive", chosen),
        html.H3("Streaming without the sink"),
        html.P(id="sinks-streaming-note", className="wb-note"),
        html.Div(id="sinks-streaming-box", children=[
            dcc.RadioItems(id="sinks-curve", value="running", inline=True, options=[
                {"label": " running perplexity since the window filled ", "value": "running"},
                {"label": " perplexity in bins of positions", "value": "binned"}]),
            exports.graph("sinks-streaming", chosen),
            dash_table.DataTable(id="sinks-streaming-table", style_cell={"fontSize": "0.85em"}),
        ]),
    ])


exports.follow("sinks-run", page="sinks", graphs=[
    "sinks-heatmap", "sinks-rates", "sinks-mass", "sinks-receivers", "sinks-massive",
    "sinks-streaming"])


@callback(Output("sinks-input", "options"), Output("sinks-input", "value"),
          Output("sinks-metric", "options"), Output("sinks-metric", "value"),
          Output("sinks-summary", "children"), Output("sinks-error", "children"),
          Input("sinks-run", "value"))
@safe
def choose_run(run_id: RunId):
    if not run_id:
        return (no_update,) * 6
    run = data.get_run(run_id, shows=SHOWS)
    inputs = list(dict.fromkeys(data.table(run, SINK_RATES.name).input))
    names = sorted(set(data.table(run, HEAD_SCORES.name).metric), key=lambda m: (m != ALPHA_1, m))
    return (inputs, inputs[0], names, ALPHA_1,
            [html.Li(line) for line in run.meta.summary], None)


def _input_scores(run: Run, input_name: str) -> pd.DataFrame:
    """The per-input head scores of ``input_name``.

    Raises:
        Refused: the run scored no such input.
    """
    scores = data.table(run, INPUT_SCORES.name)
    among("input name", input_name, list(dict.fromkeys(scores.input)), "the run's inputs")
    return scores[scores.input == input_name]


@callback(Output("sinks-heatmap", "figure"), Input("sinks-run", "value"),
          Input("sinks-input", "value"), Input("sinks-metric", "value"))
@safe
def draw_heatmap(run_id: RunId, input_name: Name, metric: Name):
    if not run_id or not input_name or not metric:
        return no_update
    scores = _input_scores(data.get_run(run_id, shows=SHOWS), input_name)
    among("metric", metric, sorted(set(scores.metric)), f"the metrics of {input_name}")
    declared = metrics.get(metric)
    title = f"{metric} ({input_name})<br><sup>{declared.meaning}</sup>"
    return figures.head_heatmap(scores, metric, title=title, colorscale="Blues",
                                zmin=0 if declared.bounded else None,
                                zmax=1 if declared.bounded else None)


@callback(Output("sinks-mass", "figure"), Output("sinks-receivers", "figure"),
          Output("sinks-massive", "figure"),
          Input("sinks-run", "value"), Input("sinks-input", "value"))
@safe
def draw_input(run_id: RunId, input_name: Name):
    if not run_id or not input_name:
        return no_update, no_update, no_update
    run = data.get_run(run_id, shows=SHOWS)
    scores = _input_scores(run, input_name)
    eps = float(data.table(run, SINK_RATES.name).eps.iloc[0])
    return (mass_figure(scores, input_name),
            receivers_figure(data.table(run, TOP_RECEIVERS.name), input_name),
            massive_figure(data.table(run, MASSIVE_ACTIVATIONS.name), input_name, eps))


@callback(Output("sinks-rates", "figure"), Output("sinks-streaming-table", "data"),
          Output("sinks-streaming-table", "columns"), Output("sinks-streaming-note", "children"),
          Output("sinks-streaming-box", "style"), Input("sinks-run", "value"))
@safe
def draw_run(run_id: RunId):
    if not run_id:
        return no_update, no_update, no_update, no_update, no_update
    run = data.get_run(run_id, shows=SHOWS)
    rates = rates_figure(data.table(run, SINK_RATES.name))
    if STREAMING_PERPLEXITY.name not in run.table_names():
        why = skip_reason(run, "streaming") or "the run records no reason"
        return rates, [], [], f"streaming perplexity: skipped ({why})", HIDDEN
    table = data.table(run, STREAMING_PERPLEXITY.name)
    shown = table[STREAMING_SHOWN].round(3).astype(object).where(
        table[STREAMING_SHOWN].notna(), "")
    note = (f"{int(table.n_tokens.iloc[0])}-token text; masks at absolute positions; "
            "ppl_matched compares every variant on the positions where the recompute "
            "reference is evaluated.")
    return (rates, shown.to_dict("records"), [{"name": c, "id": c} for c in STREAMING_SHOWN],
            note, {})


def skip_reason(run: Run, part: str) -> str | None:
    """Why the run skipped ``part`` (a ``part`` of its ``skipped`` table), if it says."""
    if SKIPPED.name not in run.table_names():
        return None
    skipped = data.table(run, SKIPPED.name)
    reasons = skipped[skipped.part == part].reason
    return str(reasons.iloc[0]) if len(reasons) else None


@callback(Output("sinks-streaming", "figure"), Input("sinks-run", "value"),
          Input("sinks-curve", "value"))
@safe
def draw_streaming(run_id: RunId, curve: Annotated[str | None, OneOf(CURVES)]):
    if not run_id:
        return no_update
    run = data.get_run(run_id, shows=SHOWS)
    if STREAMING_PERPLEXITY.name not in run.table_names():
        return no_update  # the section is hidden and the note says why
    table = data.table(run, STREAMING_PERPLEXITY.name)
    losses = data.table(run, STREAMING_LOSSES.name)
    if table.window.dropna().empty:  # rows, but none with a window
        raise WorkbenchError(f"run {run.id}: table {STREAMING_PERPLEXITY.name} holds no "
                             "row with a cache window: nothing to draw")
    if curve == "binned":
        return streaming_figure(losses, table)
    return running_figure(losses, table)


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
        by_layer = part.groupby("layer")
        share = by_layer.apply(lambda g: np.average(g.mean_share, weights=g["count"]),
                               include_groups=False)
        common = by_layer.apply(lambda g: f"{g.loc[g.fraction.idxmax(), 'token_type']} "
                                          f"({g.fraction.max():.0%})", include_groups=False)
        fig.add_scatter(x=share.index, y=share.to_numpy(), mode="lines+markers",
                        name=f"rank {rank}", customdata=common.to_numpy(),
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
                        mode="lines+markers" if label.startswith("recompute") else "lines")
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
