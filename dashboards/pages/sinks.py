"""Attention sinks: alpha_1 per head, sink rates by input, where the attention mass goes,
massive activations by layer, and perplexity when the sink is evicted (attention-sinks).

Everything shown is read from the run's tables, by the names declared in
``experiments/attention_sinks/tables.py``; a part the run skipped is explained from its
``skipped`` table.
"""

from __future__ import annotations

from typing import Annotated

import dash
import pandas as pd
from dash import Input, Output, callback, dash_table, dcc, html, no_update

from dashboards.components import data, exports
from dashboards.components.controls import labelled, run_search
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
from workbench.views import pages, style
from workbench.views.sinks import (
    mass_figure,
    massive_figure,
    rates_figure,
    receivers_figure,
    running_figure,
    streaming_figure,
)

SHOWS = pages.shows("/sinks")
run_search("sinks-run", SHOWS)
dash.register_page(__name__, path="/sinks", name="Sinks",
                   order=pages.order("/sinks"), experiments=SHOWS)

EMPTY = ("No attention-sinks runs yet. Make one with "
         "`workbench run attention-sinks --model smollm2`.")
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
    return style.head_heatmap(scores, metric, title=title, colorscale="Blues",
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


