"""Long-context view: one head's whole T x T pattern pooled to screen resolution, a window
zoomed down to single tokens, the attention each key receives, and the top-k keys of a
chosen query. Of a ``qk`` recording every weight drawn is exact, computed from the stored
queries and keys for just the window's rows and keys; past the figure's cells a window is
max- or sum-pooled, and its title says so.

The pooling is done on the server (:meth:`workbench.recording.reader.Recording.pooled`), so
an 8,192-token pattern reaches the browser as at most 512 x 512 cells, and each figure reads
only the chunks of the query rows it shows. Drag a box on the overview (Plotly's zoom) to
open that window; click a cell of the window to list its query's top-k keys. On a sliding
layer (the recording's model says which, ``ModelInfo.window``) both heatmaps mark the
window's edge, the keys ``k = q - (W - 1)``, with a dashed line: every key left of it has
weight exactly 0.

The page opens on the recording's strongest attention sink (the head with the largest mean
weight on the first key), on a log colour scale that shows the weight it spreads beyond
that key, with the last query's top keys listed.
"""

from __future__ import annotations

from typing import Annotated

import dash
from dash import Input, Output, callback, dcc, html, no_update

from dashboards.components import data, exports
from dashboards.components.controls import (
    check_choice,
    colour_scale,
    labelled,
    last_query,
    opening_head,
    recording_choices,
    recording_layout_choices,
    run_search,
    strongest_sink,
)
from dashboards.components.messages import safe, safe_layout
from dashboards.components.skeleton import run_page
from dashboards.components.values import (
    MAX_INDEX,
    Click,
    Head,
    Index,
    Layer,
    OneOf,
    RunId,
    Scale,
    Zoom,
    below,
    coordinate,
)
from workbench.recording.reader import Recording
from workbench.views import pages, patterns, style

SHOWS = pages.shows("/long-context")
run_search("long-context-run", SHOWS)
dash.register_page(__name__, path="/long-context", name="Long context",
                   order=pages.order("/long-context"), experiments=SHOWS)

EMPTY = ("No recordings yet. Record a long document with "
         "`workbench record smollm2 --file doc.txt --patterns qk` (every weight, exactly) "
         "or `--patterns topk`.")
OVERVIEW_CELLS = patterns.OVERVIEW_CELLS
WINDOW_CELLS = 256
"""A window of up to this many tokens a side is drawn token by token, with labels."""
TOP_ROWS = 16
Pooling = Annotated[str, OneOf(("max", "sum"), optional=False)]


@safe_layout("Long context")
def layout(run: str | None = None, **_: str) -> html.Div:
    return run_page("long-context", "Long context", shows=SHOWS, requested=run, empty=EMPTY,
                    controls=_controls, problem=lambda chosen: recording_layout_choices(
                        chosen)[3], body=lambda chosen: [
        html.Div(className="wb-controls", children=[
            labelled("window: first query", _number("q0", 0)),
            labelled("first key", _number("k0", 0)),
            labelled("tokens a side", _number("span", WINDOW_CELLS)),
            labelled("query for top-k", _number("query", last_query(chosen))),
        ]),
        html.Div(className="wb-row", children=[
            exports.graph("long-context-overview", chosen),
            exports.graph("long-context-window", chosen),
        ]),
        exports.graph("long-context-received", chosen),
        html.H3("Top keys of the chosen query"),
        html.Div(id="long-context-topk"),
    ])


def _controls(chosen: str) -> list:
    prompts, layers, heads, _ = recording_layout_choices(chosen)
    layer, head = opening_head(chosen)
    return [
        labelled("prompt", dcc.Dropdown(id="long-context-prompt", options=prompts, value=0,
                                        clearable=False), "24em"),
        labelled("layer", dcc.Dropdown(id="long-context-layer", options=layers, value=layer,
                                       clearable=False)),
        labelled("head", dcc.Dropdown(id="long-context-head", options=heads, value=head,
                                      clearable=False)),
        labelled("pooling", dcc.RadioItems(id="long-context-pooling", value="max",
                                           inline=True, options=["max", "sum"])),
        colour_scale("long-context", "log"),
    ]


def _number(name: str, value: int, width: str = "7em") -> dcc.Input:
    return dcc.Input(id=f"long-context-{name}", type="number", min=0, step=1, value=value,
                     debounce=True, style={"width": width})


exports.follow("long-context-run", page="long-context",
               graphs=["long-context-overview", "long-context-window", "long-context-received"])


# A new recording opens as the page does: its strongest sink, the last query of its first
# prompt. Options and values change together, so no value is ever beyond its options.
@callback(Output("long-context-prompt", "options"), Output("long-context-prompt", "value"),
          Output("long-context-layer", "options"), Output("long-context-layer", "value"),
          Output("long-context-head", "options"), Output("long-context-head", "value"),
          Output("long-context-query", "value", allow_duplicate=True),
          Output("long-context-error", "children"), Input("long-context-run", "value"),
          prevent_initial_call=True)
@safe
def choose_run(run_id: RunId):
    prompts, layers, heads = recording_choices(run_id)
    layer, head = strongest_sink(data.recording(run_id), 0)
    return prompts, 0, layers, layer, heads, head, last_query(run_id), None


def _read_args(run_id: str | None, prompt: int | None, layer: int | None,
               head: int | None) -> Recording | None:
    """The recording, its choice checked, or ``None`` while a dropdown is empty.

    Raises:
        Refused: a prompt, layer or head the recording does not have.
    """
    if None in (run_id, prompt, layer, head):
        return None
    rec = data.recording(run_id)
    check_choice(rec, prompt, layer, head)
    return rec


@callback(Output("long-context-overview", "figure"),
          Input("long-context-run", "value"), Input("long-context-prompt", "value"),
          Input("long-context-layer", "value"), Input("long-context-head", "value"),
          Input("long-context-pooling", "value"), Input("long-context-scale", "value"))
@safe
def draw_overview(run_id: RunId, prompt: Index, layer: Layer, head: Head, pooling: Pooling,
                  scale: Scale):
    rec = _read_args(run_id, prompt, layer, head)
    if rec is None:
        return no_update
    return patterns.long_overview(rec, prompt, layer, head, pooling, scale, OVERVIEW_CELLS)


@callback(Output("long-context-received", "figure"),
          Input("long-context-run", "value"), Input("long-context-prompt", "value"),
          Input("long-context-layer", "value"), Input("long-context-head", "value"),
          Input("long-context-pooling", "value"))
@safe
def draw_received(run_id: RunId, prompt: Index, layer: Layer, head: Head, pooling: Pooling):
    rec = _read_args(run_id, prompt, layer, head)
    if rec is None:
        return no_update
    return patterns.received_strip(rec, prompt, layer, head, pooling, OVERVIEW_CELLS)


@callback(Output("long-context-q0", "value"), Output("long-context-k0", "value"),
          Output("long-context-span", "value"),
          Output("long-context-error", "children", allow_duplicate=True),
          Input("long-context-overview", "relayoutData"),
          prevent_initial_call=True)
@safe
def brush(zoom: Annotated[tuple[float, float, float, float] | None, Zoom()]):
    """A box drawn (zoomed) on the overview becomes the window."""
    if zoom is None:
        return no_update, no_update, no_update, no_update
    x0, x1, y0, y1 = zoom
    k0, q0 = max(0, round(min(x0, x1))), max(0, round(min(y0, y1)))
    span = max(1, round(max(abs(x1 - x0), abs(y1 - y0))))
    return q0, k0, span, no_update


def window_of(n: int, q0: int | None, k0: int | None, span: int | None
              ) -> tuple[int, int, int, int]:
    """The square window ``(q0, q1, k0, k1)`` the inputs ask for, moved inside ``0..n``."""
    span = max(1, min(int(span or WINDOW_CELLS), n))
    q0 = min(max(0, int(q0 or 0)), n - span)
    k0 = min(max(0, int(k0 or 0)), n - span)
    return q0, q0 + span, k0, k0 + span


@callback(Output("long-context-window", "figure"),
          Input("long-context-run", "value"), Input("long-context-prompt", "value"),
          Input("long-context-layer", "value"), Input("long-context-head", "value"),
          Input("long-context-pooling", "value"), Input("long-context-q0", "value"),
          Input("long-context-k0", "value"), Input("long-context-span", "value"),
          Input("long-context-scale", "value"))
@safe
def draw_window(run_id: RunId, prompt: Index, layer: Layer, head: Head, pooling: Pooling,
                first_query: Index, first_key: Index, span: Index, scale: Scale):
    rec = _read_args(run_id, prompt, layer, head)
    if rec is None:
        return no_update
    window = window_of(rec.length(prompt), first_query, first_key, span)
    pooled = rec.pooled(prompt, layer, head, window=window, max_cells=WINDOW_CELLS, how=pooling)
    title = (f"window: queries {window[0]}..{window[1] - 1}, keys {window[2]}..{window[3] - 1}"
             f": {patterns.pooling_note(pooled)}<br>click a cell to list its query's top keys")
    fig = patterns.pooled_heatmap(pooled, rec.tokens(prompt), title, scale)
    edge = patterns.mark_edge(fig, rec.model.window(layer), pooled)
    return style.set_title(fig, title + edge, size=13)


def query_of(point: dict) -> int:
    """The query position of a click on the window: its ``y`` is a position (a pooled
    window) or a label ``"position 'token'"`` (a window of single tokens).

    Raises:
        ValueError: neither.
    """
    y = point.get("y")
    # int() raises ValueError for a label that does not start with a position
    position = int(y.split(" ", 1)[0][:10]) if isinstance(y, str) else round(coordinate(y))
    if not 0 <= position <= MAX_INDEX:
        raise ValueError(position)
    return position


@callback(Output("long-context-query", "value"),
          Output("long-context-error", "children", allow_duplicate=True),
          Input("long-context-window", "clickData"), prevent_initial_call=True)
@safe
def choose_query(query: Annotated[int | None, Click(query_of, "a click on a cell of the "
                                                             "window")]):
    if query is None:
        return no_update, no_update
    return query, no_update


@callback(Output("long-context-topk", "children"),
          Input("long-context-run", "value"), Input("long-context-prompt", "value"),
          Input("long-context-layer", "value"), Input("long-context-head", "value"),
          Input("long-context-query", "value"))
@safe
def list_topk(run_id: RunId, prompt: Index, layer: Layer, head: Head, query: Index):
    rec = _read_args(run_id, prompt, layer, head)
    if rec is None or query is None:
        return no_update
    q = below("query", query, rec.length(prompt), "positions in the prompt")
    rows = rec.pattern_sparse(prompt, layer, head, queries=(q, q + 1))
    tokens = rec.tokens(prompt)
    kept = [(int(k), float(w)) for k, w in zip(rows.keys[0], rows.weights[0], strict=True)
            if k != rows.sentinel and w > 0][:TOP_ROWS]
    body = [html.Tr([html.Td(str(rank + 1)), html.Td(str(k)), html.Td(repr(tokens[k])),
                     html.Td(f"{w:.4f}"), html.Td(str(q - k))])
            for rank, (k, w) in enumerate(kept)]
    exact = (f"exact: first token {rows.first[0]:.4f}, self {rows.diagonal[0]:.4f}, "
             f"previous {rows.previous[0]:.4f}; left out of the top {rows.weights.shape[-1]}: "
             f"{rows.left_out[0]:.4f}")
    return html.Div([
        html.P(f"query {q} {tokens[q]!r} (L{layer}H{head})", className="wb-note"),
        html.Table(className="wb-table", id="long-context-topk-table", children=[
            html.Thead(html.Tr([html.Th(c) for c in ("rank", "key", "token", "weight",
                                                     "distance")])),
            html.Tbody(body)]),
        html.P(exact, className="wb-note", id="long-context-topk-exact"),
    ])
