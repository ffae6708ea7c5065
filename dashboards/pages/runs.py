"""Runs: every stored run, filtered by experiment, model and status; each complete run
links ("open") to the page that shows it (:mod:`dashboards.components.links`), and
``?run=ID`` selects one, with its provenance and its tables to download. Each row says
what tells the run apart (the config values it changed from its experiment's defaults, the
sweep it was a cell of), how long it took, and whether the machine was busy meanwhile
(:mod:`workbench.harness.run_facts`).

Damaged runs (a ``run.json`` that fails its checks) are listed too, with the reason; they
open in no page.

The table is paged and sorted by the server, from the store's index: only a page's 20 rows
are sent, each run on the page read again from its own ``run.json`` (so a run changed since
its index row was written shows as it is now), and the page opens about as fast on a store
of 10,000 runs as on one of ten."""

from __future__ import annotations

import json
import math
from typing import Annotated, get_args

import dash
from dash import Input, Output, State, callback, dash_table, dcc, html

from dashboards.components import data, exports, links
from dashboards.components.controls import labelled
from dashboards.components.messages import message, safe, safe_layout
from dashboards.components.values import (
    Fields,
    Index,
    ListOf,
    Name,
    OneOf,
    Records,
    RunId,
    Whole,
    below,
    check,
    triggered,
)
from workbench.core.options import Status
from workbench.harness import run_facts
from workbench.store.runs import Run
from workbench.views import pages

# ``reproduce`` runs (claim verdicts) have no page of their own: they open here, with their
# summary (the verdict counts) and their ``claims`` table to download.
dash.register_page(__name__, path="/", name="Runs",
                   order=pages.order("/"), experiments=pages.shows("/"))

PAGE_SIZE = 20
COLUMNS = ["open", "run", "experiment", "model", "status", "started", "duration", "load",
           "varies", "sweep", "tables", "problem"]
StatusChoice = Annotated[str | None, OneOf(get_args(Status))]
SelectedRows = Annotated[list[int] | None, ListOf(Whole(optional=False), 1)]
"""The table's ``selected_rows`` (one row at most: it selects a single run)."""
SortBy = Annotated[list[dict] | None, ListOf(Fields((
    ("column_id", OneOf(tuple(COLUMNS), optional=False)),
    ("direction", OneOf(("asc", "desc"), optional=False)))), 1)]
"""The table's ``sort_by``: one column, ascending or descending."""
FILTERS = ("runs-experiment", "runs-model", "runs-status")


def open_cell(run: Run) -> str:
    """A markdown link to the page that shows a complete run (nothing for the others)."""
    if run.status != "complete":
        return ""
    return f"[open]({links.run_link(run.id, run.experiment)})"


def row(run: Run, sweeps: dict[str, Run]) -> dict[str, str]:
    """One line of the table; ``sweeps`` are the parents of cells (:func:`run_facts.parents`),
    ``problem`` is why a run is damaged, failed or interrupted."""
    return {"open": open_cell(run), "run": run.id, "experiment": run.experiment,
            "model": run_facts.sweep_name(run) or run.model_name or "-", "status": run.status,
            "started": run.started_at[:19],
            "duration": run_facts.duration_text(run.seconds), "load": run_facts.load_text(run),
            "varies": run_facts.varies_text(run), "sweep": run_facts.parent_text(run, sweeps),
            "tables": ", ".join(run.table_names()),
            "problem": "" if run.status == "complete" else run.error or ""}


def model_of(run: Run) -> str:
    """The table's ``model`` cell: a sweep's spec name, else the model's name."""
    return run_facts.sweep_name(run) or run.model_name or "-"


@safe_layout("Runs")
def layout(experiment: str | None = None, model: str | None = None, run: str | None = None,
           **_: str) -> html.Div:
    # the filters' choices and the count from the index (the table below is checked)
    runs = data.runs(status=None)
    experiments = sorted({r.experiment for r in runs} - {"-"})
    models = sorted({model_of(r) for r in runs} - {"-"})
    damaged = sum(r.status == "damaged" for r in runs)
    note = f"{len(runs)} runs in {data.store().root}"
    return html.Div([
        html.H2("Runs"),
        html.P(note + (f"; {damaged} damaged (see the problem column)" if damaged else ""),
               className="wb-note"),
        html.Div(id="runs-error"),
        dcc.Store(id="runs-requested", data=run),
        dcc.Store(id="runs-selected"),
        html.Div(className="wb-controls", children=[
            labelled("experiment", dcc.Dropdown(experiments, experiment, id="runs-experiment",
                                                placeholder="all")),
            labelled("model", dcc.Dropdown(models, model, id="runs-model", placeholder="all")),
            labelled("status", dcc.Dropdown(list(get_args(Status)), None, id="runs-status",
                                            placeholder="all")),
        ]),
        dash_table.DataTable(
            id="runs-table", columns=[{"name": c, "id": c, "presentation": "markdown"}
                                      if c == "open" else {"name": c, "id": c}
                                      for c in COLUMNS],
            markdown_options={"link_target": "_self"},
            sort_action="custom", sort_mode="single", sort_by=[], page_action="custom",
            page_current=0, page_size=PAGE_SIZE, page_count=1, row_selectable="single",
            style_cell={"textAlign": "left", "fontSize": "0.85em", "whiteSpace": "normal",
                        "maxWidth": "30em"},
            style_data_conditional=[
                {"if": {"filter_query": '{status} != "complete"'}, "color": "#b91c1c"},
                {"if": {"filter_query": '{load} = "busy"', "column_id": "load"},
                 "color": "#b45309", "fontWeight": "bold"}],
            tooltip_header={"load": "busy: the machine's load average was above its cores "
                                    "at the run's start or end, so its duration is not its own",
                            "varies": "the config values the run changed from its "
                                      "experiment's defaults",
                            "sweep": "the sweep (its spec's name) the run was a cell of"},
        ),
        html.Div(id="runs-detail", style={"marginTop": "1em"}),
        exports.table_download("runs"),
    ])


def sorted_runs(runs: list[Run], sort_by: list[dict] | None) -> list[Run]:
    """``runs`` in the table's order: newest first, or by the sorted column's text, as the
    table shows it."""
    if not sort_by:
        return runs
    sweeps = run_facts.parents(data.runs(status=None))
    cells = {r.id: row(r, sweeps)[sort_by[0]["column_id"]] for r in runs}
    return sorted(runs, key=lambda r: cells[r.id], reverse=sort_by[0]["direction"] == "desc")


@callback(Output("runs-table", "data"), Output("runs-table", "selected_rows"),
          Output("runs-table", "page_current"), Output("runs-table", "page_count"),
          Output("runs-error", "children"),
          Input("runs-experiment", "value"), Input("runs-model", "value"),
          Input("runs-status", "value"), Input("runs-table", "page_current"),
          Input("runs-table", "sort_by"), State("runs-requested", "data"))
@safe
def filter_runs(experiment: Name, model: Name, status: StatusChoice, page: Index,
                sort_by: SortBy, requested: RunId):
    runs = [r for r in data.runs(experiment=experiment, status=status)
            if not model or model_of(r) == model]
    runs = sorted_runs(runs, sort_by)
    pages = max(1, math.ceil(len(runs) / PAGE_SIZE))
    picked, note = None, None
    if triggered() in FILTERS:  # a new filter starts on the first page
        page = 0
    elif triggered() is None and requested:  # ?run=ID: the page that holds it, selected
        picked = next((i for i, r in enumerate(runs) if r.id == requested), None)
        if picked is None:
            data.listed_run(requested)  # raises: no such run, said in the banner
            note = message(f"run {requested} is not among the runs these filters show")
        else:
            page = picked // PAGE_SIZE
    page = min(page or 0, pages - 1)
    # the page's runs as their own folders hold them now
    shown = [data.store().by_id(r.id) or r for r in runs[page * PAGE_SIZE:(page + 1) * PAGE_SIZE]]
    sweeps = run_facts.parents(data.runs(status=None))
    made = {r.id: row(r, sweeps) for r in shown}
    selected = [] if picked is None else [picked % PAGE_SIZE]
    return [made[r.id] for r in shown], selected, page, pages, note


@callback(Output("runs-detail", "children"), Output("runs-selected", "data"),
          Input("runs-table", "selected_rows"), State("runs-table", "data"))
@safe
def show_run(selected: SelectedRows, rows: Annotated[list[dict] | None, Records()]):
    if not selected:
        return html.P("Select a run to open it.", className="wb-note"), None
    rows = rows or []  # both come from the client: the row's run is checked by the store
    row = rows[below("selected row", selected[0], len(rows), "rows in the table")]
    run = data.listed_run(check("run", RunId, row.get("run")))
    return detail(run), run.id


exports.follow("runs-selected", page="runs", prop="data")


def detail(run: Run) -> list:
    """A run's provenance, config, summary and the links to the pages that show it."""
    meta = run.meta
    children: list = [html.H3(run.id)]
    pages = links.pages_by_experiment().get(run.experiment, [])
    if run.status == "complete":
        children.append(html.Div([
            dcc.Link(f"open in {page['name']}", href=f"{page['relative_path']}?run={run.id}",
                     className="wb-open", style={"marginRight": "1.5em"})
            for page in pages if page["path"] != links.RUNS_PAGE]))
    if meta.error:
        children.append(message(f"{run.status}: {meta.error}"))
    if run.status == "damaged":
        return children  # its run.json cannot be trusted to say more
    shown = meta.model_dump(mode="json", include={
        "run_id", "experiment", "status", "started_at", "ended_at", "workbench_version",
        "git", "seed", "model", "config", "tables", "load_at_start", "load_at_end"})
    took = run_facts.duration_text(run.seconds)
    changed = run.interventions_text or "none"
    children += [html.P(f"interventions: {changed}", id="runs-interventions",
                        className="wb-note"),
                 html.P(f"wall time {took}; {meta.load_note}", id="runs-wall-time",
                        className="wb-note"),
                 html.Ul([html.Li(line) for line in meta.summary]),
                 html.Pre(json.dumps(shown, indent=2), className="wb-pre")]
    return children
