"""Take a figure or a table away: PNG and SVG buttons under each graph, and a "download
this table as CSV / Parquet" control, both named after the run they show.

A page builds its graphs with :func:`graph` and puts one :func:`table_download` in its
layout, then calls :func:`follow` once at import time with the id of its run dropdown:
from then on every export is named ``<run id>-<graph id>.png`` (or ``.svg``) and every
download ``<run id>-<table>.csv`` (or ``.parquet``), and the table list is the run's.
Plotly's own camera button saves the PNG too; the SVG needs the button here, since
``toImageButtonOptions`` holds one format per graph.

Examples:
    >>> exports.follow("sinks-run", page="sinks", graphs=["sinks-heatmap"])   # doctest: +SKIP
    >>> html.Div([exports.graph("sinks-heatmap"),
    ...           exports.table_download("sinks")])                            # doctest: +SKIP
"""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from dash import (
    MATCH,
    Input,
    Output,
    State,
    callback,
    clientside_callback,
    dcc,
    html,
    no_update,
)

from dashboards.components import data
from dashboards.components.messages import safe
from dashboards.components.values import Clicks, JsonPair, Refused, RunId, shown, triggered

ImageFormat = Literal["png", "svg"]
TableFormat = Literal["csv", "parquet"]
IMAGE_FORMATS: tuple[ImageFormat, ...] = ("png", "svg")
TABLE_FORMATS: tuple[TableFormat, ...] = ("csv", "parquet")
EXPORT = "wb-export"
TableChoice = Annotated[tuple[str, str] | None, JsonPair()]
"""The download dropdown's value, read as (run id, table name) (:func:`table_choice`)."""


def filename(run_id: str | None, name: str) -> str:
    """The file name (without its extension) of ``name`` exported from run ``run_id``."""
    return f"{run_id}-{name}" if run_id else name


def graph_config(graph_id: str, run_id: str | None = None) -> dict[str, Any]:
    """A ``dcc.Graph`` config whose camera button saves a PNG named after the run."""
    return {"displaylogo": False, "toImageButtonOptions": {
        "format": "png", "filename": filename(run_id, graph_id), "scale": 2}}


def graph(graph_id: str, run_id: str | None = None, *, hidden: bool = False,
          **kwargs: Any) -> html.Div:
    """A ``dcc.Graph`` with a PNG and an SVG button under it.

    Args:
        graph_id: the graph's id (the page's callbacks draw into it as usual).
        run_id: the run shown first (the name of an export before :func:`follow` runs).
        hidden: start hidden (a callback shows it by setting the box's ``style``).
        **kwargs: passed to ``dcc.Graph`` (``style``, ...).

    Returns:
        A ``Div`` with id ``<graph_id>-panel`` holding the graph and its buttons.
    """
    buttons = [html.Button(fmt.upper(), id={"type": EXPORT, "graph": graph_id, "format": fmt},
                           className="wb-export-button", title=f"download as {fmt.upper()}")
               for fmt in IMAGE_FORMATS]
    style = {"display": "none"} if hidden else None
    return html.Div(id=f"{graph_id}-panel", className="wb-figure", style=style, children=[
        dcc.Graph(id=graph_id, config=graph_config(graph_id, run_id), **kwargs),
        html.Div(buttons, className="wb-export"),
    ])


def _table_id(page: str, part: str) -> str:
    return f"{page}-download-{part}"


def table_download(page: str) -> html.Div:
    """A run's tables to download: pick one, then CSV or Parquet.

    Args:
        page: the page's id prefix (as given to :func:`follow`); the control's ids are
            ``<page>-download-table``, ``-csv``, ``-parquet``, ``-file`` and ``-error``.
    """
    buttons = [html.Button("CSV" if fmt == "csv" else "Parquet", id=_table_id(page, fmt),
                           className="wb-export-button") for fmt in TABLE_FORMATS]
    return html.Div(className="wb-controls wb-download", children=[
        html.Div([html.Label("download this table"),
                  dcc.Dropdown(id=_table_id(page, "table"), clearable=False,
                               placeholder="a table of the run")],
                 className="wb-control", style={"minWidth": "20em"}),
        *buttons,
        html.Span(id=_table_id(page, "error")),
        dcc.Download(id=_table_id(page, "file")),
    ])


def table_choice(run_id: str, table: str) -> str:
    """The value of a table in the download dropdown: the run and the table's name."""
    return json.dumps([run_id, table])


def follow(run_input: str, *, page: str, graphs: Sequence[str] = (),
           prop: str = "value") -> None:
    """Name the page's exports after the run chosen in ``run_input``, list its tables, and
    serve the page's table downloads.

    Call it once, at the page's import, beside its callbacks.

    Args:
        run_input: id of the component that holds the page's run id.
        page: the page's id prefix (as given to :func:`table_download`).
        graphs: ids of the page's graphs made with :func:`graph`.
        prop: the property of ``run_input`` that holds the run id.
    """
    outputs = [Output(g, "config") for g in graphs]
    outputs += [Output(_table_id(page, "table"), "options"),
                Output(_table_id(page, "table"), "value"),
                Output(_table_id(page, "table"), "placeholder"),
                # a refused run id is said where the downloads are
                Output(_table_id(page, "error"), "children", allow_duplicate=True)]

    @callback(*outputs, Input(run_input, prop), prevent_initial_call="initial_duplicate")
    @safe
    def name_exports(run_id: RunId):
        if not run_id:
            return (no_update,) * len(outputs)
        run = data.listed_run(run_id)
        names = run.table_names() if run.status == "complete" else []  # others: no tables
        options = [{"label": t, "value": table_choice(run.id, t)} for t in names]
        return (*(graph_config(g, run.id) for g in graphs), options,
                options[0]["value"] if options else None,
                "a table of the run" if options else "this run has no tables", no_update)

    buttons = {_table_id(page, fmt): fmt for fmt in TABLE_FORMATS}

    @callback(Output(_table_id(page, "file"), "data"),
              Output(_table_id(page, "error"), "children"),
              *(Input(button, "n_clicks") for button in buttons),
              State(_table_id(page, "table"), "value"), prevent_initial_call=True)
    @safe
    def download(csv_clicks: Clicks, parquet_clicks: Clicks, choice: TableChoice):
        pressed = triggered()
        if not isinstance(pressed, str) or pressed not in buttons:
            raise Refused(f"trigger: expected one of the download buttons, got "
                          f"{shown(pressed)}")
        return send_table(choice, buttons[pressed])


def send_table(choice: tuple[str, str] | None, fmt: TableFormat) -> tuple[Any, None]:
    """The chosen table of a listed, complete run as a ``dcc.Download`` payload.

    Args:
        choice: the dropdown's run and table (:func:`table_choice`), from the client.
        fmt: ``csv`` or ``parquet``.

    Returns:
        The download and no error message (nothing chosen: ``no_update``).

    Raises:
        WorkbenchError: no such run, a run that is not complete, or no such table.
    """
    if choice is None:
        return no_update, None
    run_id, name = choice  # from the client: both are checked by the store
    run = data.get_run(run_id)
    table = data.table(run, name)
    stem = filename(run.id, name)
    if fmt == "csv":
        return dcc.send_data_frame(table.to_csv, f"{stem}.csv", index=False), None
    buffer = io.BytesIO()
    table.to_parquet(buffer, index=False)
    return dcc.send_bytes(buffer.getvalue(), f"{stem}.parquet"), None


# Plotly saves any format from the browser; the file name is the graph's current config's,
# which :func:`follow` keeps set to the run shown.
clientside_callback(
    """function(n, id) {
        const none = window.dash_clientside.no_update;
        const el = document.querySelector(`#${CSS.escape(id.graph)} .js-plotly-plot`);
        if (!n || !el || !window.Plotly) { return none; }
        const opts = (el._context && el._context.toImageButtonOptions) || {};
        window.Plotly.downloadImage(el, {format: id.format, filename: opts.filename || id.graph,
                                         width: el._fullLayout.width,
                                         height: el._fullLayout.height});
        return "download as " + id.format.toUpperCase();
    }""",
    Output({"type": EXPORT, "graph": MATCH, "format": MATCH}, "title"),
    Input({"type": EXPORT, "graph": MATCH, "format": MATCH}, "n_clicks"),
    State({"type": EXPORT, "graph": MATCH, "format": MATCH}, "id"),
    prevent_initial_call=True,
)
