"""Runs: every stored run, filtered by experiment, model and status; open one.

Damaged runs (a ``run.json`` that fails its checks) are listed too, with the reason; they
open in no page."""

from __future__ import annotations

import json
from typing import Any, get_args

import dash
from dash import Input, Output, State, callback, dash_table, dcc, html

from dashboards.components import data
from dashboards.components.controls import labelled
from dashboards.components.messages import message, safe, safe_layout
from workbench.core.options import Status
from workbench.store.runs import Run

dash.register_page(__name__, path="/", name="Runs", order=0)

COLUMNS = ["run", "experiment", "model", "status", "started", "tables", "problem"]


def _text(value: Any, default: str = "-") -> str:
    """A ``run.json`` field for display (a damaged run's may be of any type, or missing)."""
    return value if isinstance(value, str) and value else default


def _model(run: Run) -> str:
    model = run.meta.get("model")
    return _text(model.get("name")) if isinstance(model, dict) else "-"


def _tables(run: Run) -> list[str]:
    tables = run.meta.get("tables")
    return sorted(str(name) for name in tables) if isinstance(tables, dict) else []


def row(run: Run) -> dict[str, str]:
    """One line of the table; ``problem`` is why a run is damaged, failed or interrupted."""
    return {"run": run.id, "experiment": _text(run.meta.get("experiment")),
            "model": _model(run), "status": run.status,
            "started": _text(run.meta.get("started_at"), "")[:19],
            "tables": ", ".join(_tables(run)),
            "problem": "" if run.status == "complete" else _text(run.meta.get("error"), "")}


@safe_layout("Runs")
def layout(experiment: str | None = None, model: str | None = None, **_: str) -> html.Div:
    runs = data.runs(status=None)
    rows = [row(r) for r in runs]
    experiments = sorted({r["experiment"] for r in rows} - {"-"})
    models = sorted({r["model"] for r in rows} - {"-"})
    damaged = sum(r.status == "damaged" for r in runs)
    note = f"{len(runs)} runs in {data.store().root}"
    return html.Div([
        html.H2("Runs"),
        html.P(note + (f"; {damaged} damaged (see the problem column)" if damaged else ""),
               className="wb-note"),
        html.Div(id="runs-error"),
        html.Div(className="wb-controls", children=[
            labelled("experiment", dcc.Dropdown(experiments, experiment, id="runs-experiment",
                                                placeholder="all")),
            labelled("model", dcc.Dropdown(models, model, id="runs-model", placeholder="all")),
            labelled("status", dcc.Dropdown(list(get_args(Status)), None, id="runs-status",
                                            placeholder="all")),
        ]),
        dash_table.DataTable(
            id="runs-table", columns=[{"name": c, "id": c} for c in COLUMNS],
            sort_action="native", page_size=20, row_selectable="single",
            style_cell={"textAlign": "left", "fontSize": "0.85em", "whiteSpace": "normal",
                        "maxWidth": "30em"},
            style_data_conditional=[
                {"if": {"filter_query": '{status} != "complete"'}, "color": "#b91c1c"}],
        ),
        html.Div(id="runs-detail", style={"marginTop": "1em"}),
    ])


@callback(Output("runs-table", "data"), Output("runs-table", "selected_rows"),
          Output("runs-error", "children"),
          Input("runs-experiment", "value"), Input("runs-model", "value"),
          Input("runs-status", "value"))
@safe
def filter_runs(experiment: str | None, model: str | None, status: str | None):
    rows = [row(r) for r in data.runs(experiment=experiment, status=status)]
    return [r for r in rows if not model or r["model"] == model], [], None


@callback(Output("runs-detail", "children"), Input("runs-table", "selected_rows"),
          State("runs-table", "data"))
@safe
def show_run(selected: list[int] | None, rows: list[dict] | None):
    try:
        run_id = rows[selected[0]]["run"]  # both come from the client
    except (IndexError, KeyError, TypeError):
        return html.P("Select a run to open it.", className="wb-note")
    run = data.listed_run(run_id)
    meta = run.meta
    children: list = [html.H3(run.id)]
    if run.status == "complete":
        children.append(html.Div([
            dcc.Link(f"open in {page['name']}", href=f"{page['relative_path']}?run={run.id}",
                     className="wb-open", style={"marginRight": "1.5em"})
            for page in dash.page_registry.values()
            if run.experiment in page.get("experiments", ())]))
    if meta.get("error"):
        children.append(message(f"{run.status}: {meta['error']}"))
    if run.status == "damaged":
        return children  # its run.json cannot be trusted to say more
    facts = {k: meta.get(k) for k in ("run_id", "experiment", "status", "started_at",
                                      "ended_at", "workbench_version", "git", "seed")}
    children += [html.Ul([html.Li(line) for line in meta.get("summary", [])]),
                 html.Pre(json.dumps({**facts, "model": meta.get("model"),
                                      "config": meta.get("config"),
                                      "tables": meta.get("tables")}, indent=2, default=str),
                          className="wb-pre")]
    return children
