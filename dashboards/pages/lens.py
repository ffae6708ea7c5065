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
import plotly.graph_objects as go
from dash import Input, Output, callback, dcc, html, no_update

from dashboards.components import data, exports
from dashboards.components.controls import labelled
from dashboards.components.messages import safe, safe_layout
from dashboards.components.skeleton import run_page
from dashboards.components.values import Index, RunId, among
from experiments.logit_lens.tables import DIRECT_EFFECTS, LENS, LENS_LAYERS, TOKENS
from workbench.store.runs import Run
from workbench.views import pages

SHOWS = pages.shows("/lens")
dash.register_page(__name__, path="/lens", name="Logit lens",
                   order=pages.order("/lens"), experiments=SHOWS)

EMPTY = ("No logit-lens runs yet. Make one with `workbench run logit-lens --model smollm2`.")
MARGIN = {"l": 10, "r": 10, "t": 50, "b": 10}
GRAPHS = ["lens-grid", "lens-layers", "lens-direct"]
KIND_COLOURS = {"embed": "#1f2937", "head": "#2563eb", "mlp": "#f59e0b", "bias": "#9ca3af"}
TOP_COMPONENTS = 30


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


def grid_figure(rows: pd.DataFrame, tokens: pd.Series, title: str) -> go.Figure:
    """Layer boundaries down, read positions across: the answer's probability, the top
    token as each cell's text."""
    prob = rows.pivot_table(index="layer", columns="position", values="answer_prob")
    top = rows.pivot(index="layer", columns="position", values="top").loc[prob.index,
                                                                          prob.columns]
    answers = rows.drop_duplicates("position").set_index("position").answer
    labels = [f"{p}:{tokens.get(p, '')} -> {answers[p]}" for p in prob.columns]
    fig = go.Figure(go.Heatmap(
        z=prob.to_numpy(), x=labels, y=prob.index.tolist(), text=top.to_numpy(),
        texttemplate="%{text}", colorscale="Blues", zmin=0, zmax=1,
        hovertemplate="layer %{y}<br>%{x}<br>answer probability %{z:.3f}<br>top "
                      "'%{text}'<extra></extra>"))
    fig.update_layout(title=f"{title}: answer probability through the lens (text: the top "
                            "token)", height=640, margin=MARGIN,
                      xaxis={"title": "read position -> its answer", "tickangle": -60},
                      yaxis={"title": "layer boundary"})
    return fig


@callback(Output("lens-layers", "figure"), Output("lens-direct", "figure"),
          Input("lens-run", "value"))
@safe
def draw_means(run_id: RunId):
    if not run_id:
        return no_update, no_update
    run = data.get_run(run_id, shows=SHOWS)
    return (layers_figure(data.table(run, LENS_LAYERS.name)),
            direct_figure(data.table(run, DIRECT_EFFECTS.name)))


def layers_figure(layers: pd.DataFrame) -> go.Figure:
    """The mean answer probability per boundary with its interval, and the share of read
    positions whose top token is the answer."""
    fig = go.Figure()
    fig.add_scatter(x=layers.layer, y=layers.answer_prob, mode="lines+markers",
                    name="answer probability",
                    error_y={"type": "data", "symmetric": False,
                             "array": (layers.ci_high - layers.answer_prob).to_numpy(),
                             "arrayminus": (layers.answer_prob - layers.ci_low).to_numpy()})
    fig.add_scatter(x=layers.layer, y=layers.answer_top, mode="lines", name="answer on top",
                    line={"dash": "dot"})
    n = int(layers.n_prompts.max()) if len(layers) else 0
    fig.update_layout(title=f"mean over {n} prompts, 95% bootstrap intervals", height=420,
                      margin=MARGIN, xaxis={"title": "layer boundary"},
                      yaxis={"title": "probability / share", "range": [0, 1]})
    return fig


def direct_figure(direct: pd.DataFrame) -> go.Figure:
    """The components with the largest direct effects, in forward order, with intervals."""
    shown = direct.loc[direct.effect.abs().nlargest(TOP_COMPONENTS).index].sort_index()
    fig = go.Figure(go.Bar(
        x=shown.component, y=shown.effect,
        marker_color=[KIND_COLOURS.get(k, "#9ca3af") for k in shown.kind],
        error_y={"type": "data", "symmetric": False,
                 "array": (shown.ci_high - shown.effect).to_numpy(),
                 "arrayminus": (shown.effect - shown.ci_low).to_numpy()},
        hovertemplate="%{x}<br>%{y:.3f}<extra></extra>"))
    fig.update_layout(title=f"direct effects on the centred answer logit (sum over every "
                            f"component {direct.effect.sum():.3f})", height=420,
                      margin=MARGIN, xaxis={"tickangle": -60},
                      yaxis={"title": "logits"})
    return fig
