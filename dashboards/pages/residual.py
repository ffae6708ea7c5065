"""Residual stream: its norm by layer and position (the first token's outsized norm shows)."""

from __future__ import annotations

import dash
import numpy as np
from dash import Input, Output, callback, dcc, html, no_update

from dashboards.components import data, exports
from dashboards.components.controls import labelled, prompt_options, run_search
from dashboards.components.messages import safe, safe_layout
from dashboards.components.skeleton import run_page
from dashboards.components.values import Index, RunId, below
from workbench.views import pages, residual

SHOWS = pages.shows("/residual")
run_search("residual-run", SHOWS)
dash.register_page(__name__, path="/residual", name="Residual stream",
                   order=pages.order("/residual"), experiments=SHOWS)

EMPTY = "No recordings yet. Make one with `workbench record smollm2 --prompt-set natural`."


@safe_layout("Residual stream")
def layout(run: str | None = None, **_: str) -> html.Div:
    return run_page("residual", "Residual stream", shows=SHOWS, requested=run, empty=EMPTY,
                    controls=[
        labelled("prompt", dcc.Dropdown(id="residual-prompt", clearable=False), "28em"),
    ], body=lambda chosen: [
        html.P(id="residual-stats", className="wb-note"),
        exports.graph("residual-heatmap", chosen),
        exports.graph("residual-lines", chosen),
    ])


exports.follow("residual-run", page="residual", graphs=["residual-heatmap", "residual-lines"])


@callback(Output("residual-prompt", "options"), Output("residual-prompt", "value"),
          Output("residual-error", "children"), Input("residual-run", "value"))
@safe
def choose_run(run_id: RunId):
    rec = data.recording(run_id)
    prompts = prompt_options([p.tokens for p in rec.prompts], [p.label for p in rec.prompts])
    return prompts, 0, None


@callback(Output("residual-heatmap", "figure"), Output("residual-lines", "figure"),
          Output("residual-stats", "children"),
          Input("residual-run", "value"), Input("residual-prompt", "value"))
@safe
def draw(run_id: RunId, prompt: Index):
    rec = data.recording(run_id)
    if prompt is None:
        return no_update, no_update, no_update
    below("prompt", prompt, len(rec), "prompts in the recording")
    norms = residual.resid_norms(rec, prompt)
    first, rest = norms[:, 0], norms[:, 1:]
    stats = "one token only"
    if rest.shape[1]:
        ratio = first / np.median(rest, axis=1)
        peak = int(np.argmax(ratio))
        stats = (f"largest ratio of position 0's norm to the median of the other positions: "
                 f"{ratio[peak]:.1f}x at boundary {peak} (‖x₀‖ = {first[peak]:.1f}); "
                 f"largest single activation at that boundary: "
                 f"{np.abs(rec.resid(prompt, peak)).max():.1f}")
    return (residual.norm_heatmap(norms, rec.tokens(prompt)), residual.norm_lines(norms), stats)
