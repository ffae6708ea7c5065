"""Induction distance: how far back each induction head reaches (induction-distance).

Pick a run and heads (by default the four best at the shortest distance): the first figure
is each head's Olsson score against the distance ``D`` between a random sequence's two
occurrences, with 95% bootstrap intervals and the uniform-attention null dashed; on a
model with sliding-window layers a line marks the window, past which a sliding layer's
heads cannot see the target. The heatmap is every layer's best head at every distance
(a sliding layer's row goes to zero past the window); the last figure is the in-context
loss drop, first occurrence minus second, with intervals. Everything is read from the
run's tables by the names ``experiments/induction_distance/tables.py`` declares.
"""

from __future__ import annotations

from typing import Annotated

import dash
import pandas as pd
from dash import Input, Output, callback, dcc, html, no_update

from dashboards.components import data, exports
from dashboards.components.controls import labelled, run_search
from dashboards.components.messages import safe, safe_layout
from dashboards.components.skeleton import run_page
from dashboards.components.values import HeadName, ListOf, RunId
from experiments.induction_distance.tables import DISTANCE_LOSSES, DISTANCE_SCORES
from workbench.views import pages
from workbench.views.distance import curves_figure, layers_figure, loss_figure

SHOWS = pages.shows("/distance")
run_search("distance-run", SHOWS)
dash.register_page(__name__, path="/distance", name="Induction distance",
                   order=pages.order("/distance"), experiments=SHOWS)

EMPTY = ("No induction-distance runs yet. Make one with `workbench run induction-distance "
         "--model smollm2 --set max_tokens=1024`.")
GRAPHS = ["distance-curves", "distance-layers", "distance-loss"]
DEFAULT_HEADS = 4
MAX_HEADS = 12
Heads = Annotated[list[tuple[int, int]] | None, ListOf(HeadName(optional=False), MAX_HEADS)]


@safe_layout("Induction distance")
def layout(run: str | None = None, **_: str) -> html.Div:
    return run_page("distance", "Induction distance", shows=SHOWS, requested=run, empty=EMPTY,
                    controls=[
        labelled("heads", dcc.Dropdown(id="distance-heads", multi=True), "28em"),
    ], body=lambda chosen: [
        html.P(id="distance-note", className="wb-note"),
        exports.graph("distance-curves", chosen),
        html.Div(className="wb-row", children=[exports.graph("distance-layers", chosen),
                                               exports.graph("distance-loss", chosen)]),
    ])


exports.follow("distance-run", page="distance", graphs=GRAPHS)


def _name(layer: int, head: int) -> str:
    return f"L{layer}H{head}"


def default_heads(scores: pd.DataFrame, n: int = DEFAULT_HEADS) -> list[str]:
    """The ``n`` heads with the largest score at the shortest distance, best first."""
    near = scores[scores.distance == scores.distance.min()].nlargest(n, "score")
    return [_name(int(r.layer), int(r.head)) for r in near.itertuples()]


def _window(run) -> int | None:
    model = run.meta.model
    return None if model is None else model.sliding_window


@callback(Output("distance-heads", "options"), Output("distance-heads", "value"),
          Output("distance-note", "children"), Output("distance-error", "children"),
          Input("distance-run", "value"))
@safe
def choose_run(run_id: RunId):
    if not run_id:
        return (no_update,) * 4
    run = data.get_run(run_id, shows=SHOWS)
    scores = data.table(run, DISTANCE_SCORES.name)
    heads = scores.drop_duplicates(["layer", "head"]).sort_values(["layer", "head"])
    options = [_name(int(r.layer), int(r.head)) for r in heads.itertuples()]
    window = _window(run)
    note = (f"Distances {int(scores.distance.min())} to {int(scores.distance.max())} tokens, "
            f"{int(scores.n_prompts.max())} prompts. "
            + (f"Sliding layers see the last {window} keys: past D = {window} their "
               "target is out of reach." if window else "Every layer is global."))
    return options, default_heads(scores), note, None


@callback(Output("distance-curves", "figure"), Input("distance-run", "value"),
          Input("distance-heads", "value"))
@safe
def draw_curves(run_id: RunId, heads: Heads):
    if not run_id or not heads:
        return no_update
    run = data.get_run(run_id, shows=SHOWS)
    return curves_figure(data.table(run, DISTANCE_SCORES.name), heads, _window(run))


@callback(Output("distance-layers", "figure"), Output("distance-loss", "figure"),
          Input("distance-run", "value"))
@safe
def draw_overview(run_id: RunId):
    if not run_id:
        return no_update, no_update
    run = data.get_run(run_id, shows=SHOWS)
    return (layers_figure(data.table(run, DISTANCE_SCORES.name)),
            loss_figure(data.table(run, DISTANCE_LOSSES.name)))


