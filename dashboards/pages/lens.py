"""Logit lens: where the answer appears, layer by layer, and which components write it
(logit-lens).

Pick a run and a prompt: the first heatmap is the answer's probability through the logit
lens at every layer boundary (down) and read position (across, labelled with the token
read), each cell's text the top token there; the second is the mean over prompts with its
95% bootstrap interval; the bars are each component's direct effect on the answer's centred
logit, with intervals. Everything is read from the run's tables by the names
``experiments/logit_lens/tables.py`` declares.
"""

from __future__ import annotations

import dash
import pandas as pd
from dash import Input, Output, callback, dcc, html, no_update

from dashboards.components import data, exports
from dashboards.components.controls import labelled, run_search
from dashboards.components.messages import safe, safe_layout
from dashboards.components.skeleton import run_page
from dashboards.components.values import Index, RunId, among
from experiments.logit_lens.tables import DIRECT_EFFECTS, LENS, LENS_LAYERS, TOKENS
from workbench.store.runs import Run
from workbench.views import pages
from workbench.views.lens import direct_figure, grid_figure, layers_figure

SHOWS = pages.shows("/lens")
run_search("lens-run", SHOWS)
dash.register_page(__name__, path="/lens", name="Logit lens",
                   order=pages.order("/lens"), experiments=SHOWS)

EMPTY = ("No logit-lens runs yet. Make one with `workbench run logit-lens --model smollm2`.")
GRAPHS = ["lens-grid", "lens-layers", "lens-direct"]


@safe_layout("Logit lens")
def layout(run: str | None = None, **_: str) -> html.Div:
    return run_page("lens", "Logit lens", shows=SHOWS, requested=run, empty=EMPTY,
                    controls=[
        labelled("prompt", dcc.Dropdown(id="lens-prompt", clearable=False), "10em"),
    ], body=lambda chosen: [
        html.P(id="lens-note", className="wb-note"),
        exports.graph("lens-grid", chosen),
        html.Div(className="wb-row", children=[exports.graph("lens-layers", chosen),
                                               exports.graph("lens-direct", chosen)]),
    ])


exports.follow("lens-run", page="lens", graphs=GRAPHS)


@callback(Output("lens-prompt", "options"), Output("lens-prompt", "value"),
          Output("lens-note", "children"), Output("lens-error", "children"),
          Input("lens-run", "value"))
@safe
def choose_run(run_id: RunId):
    if not run_id:
        return (no_update,) * 4
    run = data.get_run(run_id, shows=SHOWS)
    prompts = sorted(data.table(run, LENS.name).prompt.unique().tolist())
    scale = data.table(run, LENS_LAYERS.name).scale.iloc[0]
    note = (f"The final norm's scale in the lens: {scale} ("
            + ("the final stream's, so the lens is linear" if scale == "frozen" else
               "each boundary's own") + "). Layer n is the model's own output.")
    return ([{"label": f"prompt {p}", "value": p} for p in prompts],
            prompts[0] if prompts else None, note, None)


def _prompt_rows(run: Run, prompt: int) -> pd.DataFrame:
    """The lens rows of one prompt.

    Raises:
        Refused: the run read no such prompt.
    """
    lens = data.table(run, LENS.name)
    among("prompt", prompt, sorted(lens.prompt.unique().tolist()), "the run's prompts")
    return lens[lens.prompt == prompt]


@callback(Output("lens-grid", "figure"), Input("lens-run", "value"),
          Input("lens-prompt", "value"))
@safe
def draw_grid(run_id: RunId, prompt: Index):
    if not run_id or prompt is None:
        return no_update
    run = data.get_run(run_id, shows=SHOWS)
    rows = _prompt_rows(run, prompt)
    tokens = data.table(run, TOKENS.name)
    tokens = tokens[tokens.prompt == prompt].set_index("position").token
    return grid_figure(rows, tokens, f"prompt {prompt}")


@callback(Output("lens-layers", "figure"), Output("lens-direct", "figure"),
          Input("lens-run", "value"))
@safe
def draw_means(run_id: RunId):
    if not run_id:
        return no_update, no_update
    run = data.get_run(run_id, shows=SHOWS)
    return (layers_figure(data.table(run, LENS_LAYERS.name)),
            direct_figure(data.table(run, DIRECT_EFFECTS.name)))


