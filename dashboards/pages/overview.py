"""Head overview: is each head's attention broad or focused, local or long-range?

A layer x head heatmap of the chosen metric of a ``head-overview`` run (entropy,
normalized entropy, mean distance, self-attention; hover shows the 95% interval), the
metric by layer (mean over heads, with the lowest and highest head; as in Vig & Belinkov's
mean attention distance by layer), and a sortable table of every head, with the heads of a
head class outlined on the heatmap at a false-discovery rate the reader types
(:mod:`dashboards.components.head_classes`). Everything is read from the run's tables by
their declarations in ``experiments/head_overview/tables.py``."""

from __future__ import annotations

import dash
from dash import Input, Output, callback, dash_table, dcc, html, no_update

from dashboards.components import data, exports, head_classes
from dashboards.components.controls import labelled, run_search
from dashboards.components.messages import message, safe, safe_layout
from dashboards.components.skeleton import run_page
from dashboards.components.values import Name, RunId, among
from experiments.head_overview.tables import HEAD_SCORES
from workbench.scores import metrics
from workbench.views import pages, style
from workbench.views.overview import layers_figure

SHOWS = pages.shows("/overview")
run_search("overview-run", SHOWS)
dash.register_page(__name__, path="/overview", name="Overview",
                   order=pages.order("/overview"), experiments=SHOWS)

EMPTY = ("No head-overview runs yet. Make one with "
         "`workbench run head-overview --model smollm2`.")
DEFAULT_METRIC = metrics.get("normalized_entropy").name
TABLE_COLUMNS = [c for c in HEAD_SCORES.names if c != "metric"]


@safe_layout("Overview")
def layout(run: str | None = None, **_: str) -> html.Div:
    return run_page("overview", "Overview", shows=SHOWS, requested=run, empty=EMPTY, controls=[
        labelled("metric", dcc.Dropdown(id="overview-metric", clearable=False), "16em"),
        *head_classes.controls("overview"),
    ], body=lambda chosen: [
        html.Ul(id="overview-summary", className="wb-note"),
        html.Div(className="wb-row", children=[exports.graph("overview-heatmap", chosen),
                                               exports.graph("overview-layers", chosen)]),
        html.P(id="overview-classes-note", className="wb-note"),
        dash_table.DataTable(
            id="overview-table", sort_action="native", page_size=20,
            columns=[{"name": c, "id": c} for c in TABLE_COLUMNS],
            tooltip_header={c: HEAD_SCORES.column(c).meaning for c in TABLE_COLUMNS},
            style_cell={"fontSize": "0.85em", "textAlign": "left"}),
    ])


exports.follow("overview-run", page="overview", graphs=["overview-heatmap", "overview-layers"])
head_classes.follow("overview", shows=SHOWS)


@callback(Output("overview-metric", "options"), Output("overview-metric", "value"),
          Output("overview-summary", "children"), Output("overview-error", "children"),
          Input("overview-run", "value"))
@safe
def choose_run(run_id: RunId):
    run = data.get_run(run_id, shows=SHOWS)
    names = list(dict.fromkeys(data.table(run, HEAD_SCORES.name).metric))
    if not names:
        return [], None, None, message(f"run {run_id} has no head scores")
    summary = [html.Li(line) for line in run.meta.summary]
    metric = DEFAULT_METRIC if DEFAULT_METRIC in names else names[0]
    return names, metric, summary, None


@callback(Output("overview-heatmap", "figure"), Output("overview-layers", "figure"),
          Output("overview-table", "data"), Output("overview-classes-note", "children"),
          Input("overview-run", "value"), Input("overview-metric", "value"),
          Input("overview-class", "value"), Input("overview-fdr", "value"))
@safe
def draw(run_id: RunId, metric: Name, head_class: head_classes.ClassName,
         fdr: head_classes.Rate):
    if metric is None:
        return no_update, no_update, no_update, no_update
    run = data.get_run(run_id, shows=SHOWS)
    scores = data.table(run, HEAD_SCORES.name)
    among("metric", metric, list(dict.fromkeys(scores.metric)), "the run's metrics")
    declared = metrics.get(metric)
    bounded = declared.bounded  # on [0, 1], the fixed scale
    title = f"{metric} · {run.model_name}<br><sup>{declared.meaning}</sup>"
    heatmap = style.head_heatmap(scores, metric, title=title,
                                   zmin=0 if bounded else None, zmax=1 if bounded else None)
    note = head_classes.mark(heatmap, run, head_class, fdr)
    rows = scores[scores.metric == metric].sort_values(["layer", "head"])
    return (heatmap, layers_figure(scores, metric),
            rows.reindex(columns=TABLE_COLUMNS).round(4).to_dict("records"), note)
