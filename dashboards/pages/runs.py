"""Runs: every stored run, filtered by experiment, model and status; open one."""

from __future__ import annotations

import json

import dash
from dash import Input, Output, State, callback, dash_table, dcc, html

from dashboards.components import data
from dashboards.components.controls import labelled

dash.register_page(__name__, path="/", name="Runs", order=0)

COLUMNS = ["run", "experiment", "model", "status", "started", "tables"]


def layout(experiment: str | None = None, model: str | None = None, **_: str) -> html.Div:
    runs = data.runs(status=None)
    experiments = sorted({r.experiment for r in runs})
    models = sorted({r.model_name for r in runs if r.model_name})
    return html.Div([
        html.H2("Runs"),
        html.P(f"{len(runs)} runs in {data.store().root}", className="wb-note"),
        html.Div(className="wb-controls", children=[
            labelled("experiment", dcc.Dropdown(experiments, experiment, id="runs-experiment",
                                                placeholder="all")),
            labelled("model", dcc.Dropdown(models, model, id="runs-model", placeholder="all")),
            labelled("status", dcc.Dropdown(["complete", "failed", "interrupted", "running"],
                                            None, id="runs-status", placeholder="all")),
        ]),
        dash_table.DataTable(
            id="runs-table", columns=[{"name": c, "id": c} for c in COLUMNS],
            sort_action="native", page_size=20, row_selectable="single",
            style_cell={"textAlign": "left", "fontSize": "0.85em"},
            style_data_conditional=[
                {"if": {"filter_query": '{status} != "complete"'}, "color": "#b91c1c"}],
        ),
        html.Div(id="runs-detail", style={"marginTop": "1em"}),
    ])


@callback(Output("runs-table", "data"), Output("runs-table", "selected_rows"),
          Input("runs-experiment", "value"), Input("runs-model", "value"),
          Input("runs-status", "value"))
def filter_runs(experiment: str | None, model: str | None, status: str | None):
    rows = []
    for run in data.runs(experiment=experiment, status=status):
        if model and run.model_name != model:
            continue
        rows.append({"run": run.id, "experiment": run.experiment, "model": run.model_name or "-",
                     "status": run.status, "started": run.meta.get("started_at", "")[:19],
                     "tables": ", ".join(run.table_names())})
    return rows, []


@callback(Output("runs-detail", "children"), Input("runs-table", "selected_rows"),
          State("runs-table", "data"))
def show_run(selected: list[int] | None, rows: list[dict] | None):
    if not selected or not rows:
        return html.P("Select a run to open it.", className="wb-note")
    run = data.get_run(rows[selected[0]]["run"])
    links = [dcc.Link(f"open in {page['name']}", href=f"{page['relative_path']}?run={run.id}",
                      className="wb-open", style={"marginRight": "1.5em"})
             for page in dash.page_registry.values()
             if run.experiment in page.get("experiments", ())]
    meta = run.meta
    facts = {k: meta.get(k) for k in ("run_id", "experiment", "status", "started_at",
                                      "ended_at", "workbench_version", "git", "seed")}
    children = [html.H3(run.id), html.Div(links)]
    if meta.get("error"):
        children.append(html.P(f"error: {meta['error']}", className="wb-error"))
    children += [html.Ul([html.Li(line) for line in meta.get("summary", [])]),
                 html.Pre(json.dumps({**facts, "model": meta.get("model"),
                                      "config": meta.get("config"),
                                      "tables": meta.get("tables")}, indent=2),
                          className="wb-pre")]
    return children
