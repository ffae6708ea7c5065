"""Heads: layer x head score heatmaps with intervals, a sortable top-k table, a head's
attention on an example prompt, and two runs side by side.

The top-k table shows the columns of the run's ``head_scores`` table as its experiment
declares them (``experiments/<name>/tables.py``), with each column's meaning on hover."""

from __future__ import annotations

import dash
import pandas as pd
from dash import Input, Output, State, callback, ctx, dash_table, dcc, html, no_update

from dashboards.components import data, figures
from dashboards.components.controls import labelled, run_dropdown, run_options
from dashboards.components.messages import message, one_line, safe, safe_layout
from experiments.induction_heads.tables import HEAD_SCORES as INDUCTION_HEADS
from experiments.previous_token_heads.tables import HEAD_SCORES as PREVIOUS_TOKEN_HEADS
from workbench.core.errors import WorkbenchError
from workbench.recording.record import Recording
from workbench.store.runs import Run
from workbench.store.schema import Table

# The experiments this page shows, each with the declaration of the head_scores it writes.
EXPERIMENTS: dict[str, Table] = {
    "previous-token-heads": PREVIOUS_TOKEN_HEADS,
    "induction-heads": INDUCTION_HEADS,
}
SHOWS = list(EXPERIMENTS)
dash.register_page(__name__, path="/heads", name="Heads", order=3, experiments=SHOWS)


def _runs() -> list:
    return [r for exp in EXPERIMENTS for r in data.runs(exp)]


def _scores(run: Run) -> pd.DataFrame:
    """The run's head scores, found by its experiment's declaration."""
    return run.table(EXPERIMENTS[run.experiment].name)


def table_columns(declared: Table) -> list[str]:
    """The top-k table's columns: every declared column but ``metric`` (one metric is
    shown at a time)."""
    return [c for c in declared.names if c != "metric"]


@safe_layout("Heads")
def layout(run: str | None = None, compare: str | None = None, **_: str) -> html.Div:
    runs = sorted(_runs(), key=lambda r: r.meta.get("started_at", ""), reverse=True)
    if not runs:
        return html.Div([html.H2("Heads"), html.P(
            "No head-finding runs yet: `workbench run induction-heads --model smollm2`.",
            className="wb-note")])
    chosen = data.choose(run, runs, shows=SHOWS)
    problems = []
    if compare is not None:
        try:
            compare = data.choose(compare, runs, shows=SHOWS)
        except WorkbenchError as exc:  # the page still shows the run; only the comparison goes
            problems.append(message(f"compare: {one_line(exc)}"))
            compare = None
    return html.Div([
        html.H2("Heads"),
        *problems,
        html.Div(id="heads-error"),
        html.Div(className="wb-controls", children=[
            labelled("run", run_dropdown("heads-run", runs, chosen), "34em"),
            labelled("metric", dcc.Dropdown(id="heads-metric", clearable=False)),
            labelled("compare with", dcc.Dropdown(run_options(runs), compare,
                                                  id="heads-compare",
                                                  placeholder="another run (optional)"),
                     "34em"),
            labelled("top k", dcc.Input(id="heads-k", type="number", value=10, min=1,
                                        max=500, step=1)),
        ]),
        html.Div(className="wb-row", children=[dcc.Graph(id="heads-heatmap"),
                                               dcc.Graph(id="heads-compare-heatmap")]),
        html.P("Click a head in the heatmap or a row of the table to see its attention.",
               className="wb-note"),
        html.Div(className="wb-row", children=[
            dash_table.DataTable(id="heads-table", sort_action="native", page_size=20,
                                 style_cell={"fontSize": "0.85em", "textAlign": "left"}),
            dcc.Graph(id="heads-example"),
        ]),
        dcc.Store(id="heads-selected"),
    ])


@callback(Output("heads-metric", "options"), Output("heads-metric", "value"),
          Output("heads-error", "children"),
          Input("heads-run", "value"), State("heads-metric", "value"))
@safe
def choose_run(run_id: str, metric: str | None):
    metrics = list(dict.fromkeys(_scores(data.get_run(run_id, shows=SHOWS)).metric))
    if not metrics:
        return [], None, message(f"run {run_id} has no head scores")
    return metrics, metric if metric in metrics else metrics[0], None


@callback(Output("heads-heatmap", "figure"), Output("heads-table", "data"),
          Output("heads-table", "columns"), Output("heads-table", "tooltip_header"),
          Input("heads-run", "value"), Input("heads-metric", "value"), Input("heads-k", "value"))
@safe
def draw_run(run_id: str, metric: str | None, k: int | None):
    if metric is None:
        return no_update, no_update, no_update, no_update
    run = data.get_run(run_id, shows=SHOWS)
    declared = EXPERIMENTS[run.experiment]
    shown = table_columns(declared)
    scores = _scores(run)
    title = f"{metric} · {run.model_name} · {run.experiment}"
    top = scores[scores.metric == metric].nlargest(int(k or 10), "score")
    rows = top.reindex(columns=shown).round(4).to_dict("records")
    tips = {c: declared.column(c).meaning for c in shown}
    return (figures.head_heatmap(scores, metric, title=title), rows,
            [{"name": c, "id": c} for c in shown], tips)


@callback(Output("heads-compare-heatmap", "figure"), Output("heads-compare-heatmap", "style"),
          Input("heads-compare", "value"), Input("heads-metric", "value"))
@safe
def draw_compare(run_id: str | None, metric: str | None):
    if not run_id or metric is None:
        return {}, {"display": "none"}
    run = data.get_run(run_id, shows=SHOWS)
    scores = _scores(run)
    if metric not in set(scores.metric):
        return {}, {"display": "none"}
    title = f"{metric} · {run.model_name} · {run.experiment} (compared)"
    return figures.head_heatmap(scores, metric, title=title), {}


@callback(Output("heads-selected", "data"),
          Input("heads-heatmap", "clickData"), Input("heads-table", "active_cell"),
          State("heads-table", "derived_viewport_data"))
def select_head(click: dict | None, cell: dict | None, rows: list[dict] | None):
    if ctx.triggered_id == "heads-heatmap" and click:
        point = click["points"][0]
        return {"layer": int(point["y"]), "head": int(point["x"])}
    if ctx.triggered_id == "heads-table" and cell and rows:
        row = rows[cell["row"]]
        return {"layer": int(row["layer"]), "head": int(row["head"])}
    return no_update


def example_prompt(rec: Recording, inputs: str) -> int:
    """The example prompt that matches the inputs a metric was scored on."""
    want = "repeated" if "repeated" in inputs else "natural"
    for i, prompt in enumerate(rec.prompts):
        is_repeated = prompt.label.startswith("repeated")
        if (want == "repeated") == is_repeated:
            return i
    return 0


@callback(Output("heads-example", "figure"),
          Input("heads-selected", "data"), Input("heads-run", "value"),
          Input("heads-metric", "value"))
@safe
def draw_example(selected: dict | None, run_id: str, metric: str | None):
    run = data.get_run(run_id, shows=SHOWS)
    scores = _scores(run)
    picked = scores[scores.metric == metric]
    if picked.empty:
        return no_update
    if not selected:
        best = picked.nlargest(1, "score").iloc[0]
        selected = {"layer": int(best["layer"]), "head": int(best["head"])}
    if not (run.path / "example").is_dir():
        return {}  # the run recorded no example prompts
    rec = data.open_recording(run, "example")
    p = example_prompt(rec, str(picked.inputs.iloc[0]))
    layer, head = selected["layer"], selected["head"]
    score = picked[(picked["layer"] == layer) & (picked["head"] == head)].score
    label = f" ({metric} {score.iloc[0]:.2f})" if len(score) else ""
    return figures.pattern_heatmap(rec.pattern(p, layer, head), rec.tokens(p),
                                   f"L{layer}H{head} on {rec.prompts[p].label}{label}")
