"""Recording viewer: one head's attention pattern, labelled with tokens, and all heads at once.

The page opens on the recording's strongest attention sink (the head with the largest mean
weight on the first key of the first prompt); the colour scale (linear, log or power)
shows what such a head does with the rest of its weight."""

from __future__ import annotations

import dash
from dash import Input, Output, callback, dcc, html, no_update

from dashboards.components import data, exports
from dashboards.components.controls import (
    check_choice,
    colour_scale,
    labelled,
    opening_head,
    recording_choices,
    recording_layout_choices,
    run_search,
    strongest_sink,
)
from dashboards.components.messages import safe, safe_layout
from dashboards.components.skeleton import run_page
from dashboards.components.values import (
    ClickedHead,
    Head,
    Index,
    Layer,
    RunId,
    Scale,
    triggered,
)
from workbench.views import pages, patterns

SHOWS = pages.shows("/recording")
run_search("recording-run", SHOWS)
dash.register_page(__name__, path="/recording", name="Recording",
                   order=pages.order("/recording"), experiments=SHOWS)

EMPTY = ("No recordings yet. Make one with "
         "`workbench record smollm2 --prompt-set natural`.")
MAX_TOKENS = patterns.MAX_TOKENS
"""A longer prompt shows its first 512 tokens here; the Long context page shows it all."""


@safe_layout("Recording")
def layout(run: str | None = None, **_: str) -> html.Div:
    return run_page("recording", "Recording", shows=SHOWS, requested=run, empty=EMPTY,
                    controls=_controls, problem=lambda chosen: recording_layout_choices(
                        chosen)[3], body=lambda chosen: [
        html.Div(className="wb-row", children=[
            exports.graph("recording-pattern", chosen),
            exports.graph("recording-grid", chosen),
        ]),
    ])


def _controls(chosen: str) -> list:
    prompts, layers, heads, _ = recording_layout_choices(chosen)
    layer, head = opening_head(chosen)
    return [
        labelled("prompt", dcc.Dropdown(id="recording-prompt", options=prompts, value=0,
                                        clearable=False), "28em"),
        labelled("layer", dcc.Dropdown(id="recording-layer", options=layers, value=layer,
                                       clearable=False)),
        labelled("head", dcc.Dropdown(id="recording-head", options=heads, value=head,
                                      clearable=False)),
        colour_scale("recording"),
    ]


exports.follow("recording-run", page="recording", graphs=["recording-pattern", "recording-grid"])


@callback(Output("recording-prompt", "options"), Output("recording-prompt", "value"),
          Output("recording-layer", "options"), Output("recording-head", "options"),
          Output("recording-error", "children"), Input("recording-run", "value"),
          prevent_initial_call=True)
@safe
def choose_run(run_id: RunId):
    prompts, layers, heads = recording_choices(run_id)
    return prompts, 0, layers, heads, None


# A new run opens on its strongest sink, as the page does (so this is called first too); a
# refused click is said in the banner.
@callback(Output("recording-layer", "value"), Output("recording-head", "value"),
          Output("recording-error", "children", allow_duplicate=True),
          Input("recording-grid", "clickData"), Input("recording-run", "value"),
          prevent_initial_call="initial_duplicate")
@safe
def choose_head(click: ClickedHead, run_id: RunId):
    rec = data.recording(run_id)
    if triggered() == "recording-grid" and click:
        layer, head = click  # grid coordinates are in units of heads and layers
        check_choice(rec, None, layer, head)
        return layer, head, no_update
    return *strongest_sink(rec, 0), no_update


@callback(Output("recording-pattern", "figure"),
          Input("recording-run", "value"), Input("recording-prompt", "value"),
          Input("recording-layer", "value"), Input("recording-head", "value"),
          Input("recording-scale", "value"))
@safe
def draw_pattern(run_id: RunId, prompt: Index, layer: Layer, head: Head, scale: Scale):
    if prompt is None or layer is None or head is None:
        return no_update
    rec = data.recording(run_id)
    check_choice(rec, prompt, layer, head)
    return patterns.recording_pattern(rec, prompt, layer, head, scale, MAX_TOKENS)


@callback(Output("recording-grid", "figure"),
          Input("recording-run", "value"), Input("recording-prompt", "value"),
          Input("recording-scale", "value"))
@safe
def draw_grid(run_id: RunId, prompt: Index, scale: Scale):
    rec = data.recording(run_id)
    if prompt is None:
        return no_update
    check_choice(rec, prompt, None, None)
    return patterns.pattern_grid(rec, prompt, scale=scale)
