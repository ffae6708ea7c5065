"""Heads: layer x head score heatmaps with intervals, a sortable top-k table, a head's
attention on an example prompt, two runs side by side on one colour scale (and their
difference when both have the metric on the same grid of heads), and for an
``induction-heads`` run its causal evidence: loss on each repeat, the in-context-learning
score, the K-composition ablation and its path patch (the previous-token heads removed from
only the key, query or value input of the tracked induction heads, against random draws).
The heatmap outlines the heads of a head class at a false-discovery rate the reader types
(:mod:`dashboards.components.head_classes`).

The top-k table shows the columns of the run's ``head_scores`` table as its experiment
declares them (``experiments/<name>/tables.py``), with each column's meaning on hover."""

from __future__ import annotations

from typing import Annotated, Any

import dash
import pandas as pd
from dash import ALL, Input, Output, State, callback, dash_table, dcc, html, no_update

from dashboards.components import data, exports, head_classes
from dashboards.components.controls import colour_scale, labelled, run_options, run_search
from dashboards.components.messages import message, one_line, safe, safe_layout
from dashboards.components.skeleton import run_page, runs_of
from dashboards.components.values import (
    ClickedHead,
    Fields,
    Head,
    Layer,
    ListOf,
    Name,
    Records,
    RunId,
    Scale,
    Whole,
    among,
    below,
    check,
    triggered,
)
from experiments.induction_heads.tables import (
    ABLATION,
    ICL,
    LOSS_BY_POSITION,
    PATH_PATCH,
    REPEAT_LOSS,
)
from experiments.induction_heads.tables import HEAD_SCORES as INDUCTION_HEADS
from experiments.previous_token_heads.tables import HEAD_SCORES as PREVIOUS_TOKEN_HEADS
from workbench.core.errors import WorkbenchError
from workbench.recording.reader import Recording
from workbench.scores import metrics
from workbench.store.runs import Run
from workbench.store.schema import Table, with_layer_types
from workbench.views import pages, style
from workbench.views.heads import (
    ablation_figure,
    difference_figure,
    head_scores_figure,
    icl_figure,
    path_patch_figure,
    repeat_loss_figure,
    shared_range,
)

# The experiments this page shows, each with the declaration of the head_scores it writes.
EXPERIMENTS: dict[str, Table] = {
    "previous-token-heads": PREVIOUS_TOKEN_HEADS,
    "induction-heads": INDUCTION_HEADS,
}
SHOWS = pages.shows("/heads")
run_search("heads-run", SHOWS)
run_search("heads-compare", SHOWS)
dash.register_page(__name__, path="/heads", name="Heads",
                   order=pages.order("/heads"), experiments=SHOWS)

HIDDEN = {"display": "none"}
MAX_K = 500
TopK = Annotated[int | None, Whole(1, MAX_K)]
HeadCell = Annotated[dict[str, Any] | None,
                     Fields((("row", Whole(optional=False)),), extra=True)]
"""The top-k table's ``active_cell`` (Dash adds ``column``, ``column_id``, ``row_id``)."""
Selected = Annotated[dict[str, int] | None, Fields((("layer", Whole(optional=False)),
                                                    ("head", Whole(optional=False))))]
"""The head picked in the heatmap or the table (``heads-selected``)."""
GRAPHS = ["heads-heatmap", "heads-compare-heatmap", "heads-difference", "heads-example",
          "heads-repeat-loss", "heads-icl", "heads-ablation", "heads-path-patch"]


def _scores(run: Run) -> pd.DataFrame:
    """The run's head scores, found by its experiment's declaration (with each head's
    layer type, from its model for a run written before the column)."""
    scores = data.table(run, EXPERIMENTS[run.experiment].name)
    model = run.meta.model
    return scores if model is None else with_layer_types(scores, model.layer_types)


def table_columns(declared: Table) -> list[str]:
    """The top-k table's columns: every declared column but ``metric`` (one metric is
    shown at a time)."""
    return [c for c in declared.names if c != "metric"]


@safe_layout("Heads")
def layout(run: str | None = None, compare: str | None = None, **_: str) -> html.Div:
    runs = runs_of(SHOWS)
    problems = []
    if compare is not None and runs:
        try:
            compare = data.choose(compare, runs, shows=SHOWS)
        except WorkbenchError as exc:  # the page still shows the run; only the comparison goes
            problems.append(message(f"compare: {one_line(exc)}"))
            compare = None
    return run_page("heads", "Heads", shows=SHOWS, requested=run, runs=runs, notices=problems,
                    empty="No head-finding runs yet: `workbench run induction-heads --model "
                          "smollm2`.", controls=[
        labelled("metric", dcc.Dropdown(id="heads-metric", clearable=False)),
        labelled("compare with", dcc.Dropdown(run_options(runs, compare), compare,
                                              id="heads-compare",
                                              placeholder="another run (optional)"), "34em"),
        labelled("top k", dcc.Input(id="heads-k", type="number", value=10, min=1, max=MAX_K,
                                    step=1)),
        colour_scale("heads"),
        *head_classes.controls("heads"),
    ], body=lambda chosen: [
        html.Div(id="heads-compare-note"),
        html.Div(className="wb-row", children=[
            exports.graph("heads-heatmap", chosen),
            exports.graph("heads-compare-heatmap", chosen, hidden=True),
            exports.graph("heads-difference", chosen, hidden=True)]),
        html.P(id="heads-classes-note", className="wb-note"),
        html.P("Click a head in the heatmap or a row of the table to see its attention.",
               className="wb-note"),
        html.Div(className="wb-row", children=[
            dash_table.DataTable(id="heads-table", sort_action="native", page_size=20,
                                 style_cell={"fontSize": "0.85em", "textAlign": "left"}),
            exports.graph("heads-example", chosen),
        ]),
        dcc.Store(id="heads-selected"),
        html.Div(id="heads-induction", style=HIDDEN, children=[
            html.H3("Induction heads: in-context copying, in-context learning, K-composition"),
            html.Div(className="wb-row", children=[
                exports.graph("heads-repeat-loss", chosen), exports.graph("heads-icl", chosen)]),
            exports.graph("heads-ablation", chosen),
            exports.graph("heads-path-patch", chosen, hidden=True)]),
    ])


exports.follow("heads-run", page="heads", graphs=GRAPHS)
head_classes.follow("heads", shows=SHOWS, any_class=False)


@callback(Output("heads-metric", "options"), Output("heads-metric", "value"),
          Output("heads-error", "children"),
          Input("heads-run", "value"), State("heads-metric", "value"))
@safe
def choose_run(run_id: RunId, metric: Name):
    names = _metrics(_scores(data.get_run(run_id, shows=SHOWS)))
    if not names:
        return [], None, message(f"run {run_id} has no head scores")
    return names, metric if metric in names else names[0], None


def _metrics(scores: pd.DataFrame) -> list[str]:
    """The metrics a run's head scores hold, in the order the table holds them."""
    return list(dict.fromkeys(scores.metric))


def _compared(compare_id: str | None) -> pd.DataFrame | None:
    return _scores(data.get_run(compare_id, shows=SHOWS)) if compare_id else None


@callback(Output("heads-heatmap", "figure"), Output("heads-table", "data"),
          Output("heads-table", "columns"), Output("heads-table", "tooltip_header"),
          Output("heads-classes-note", "children"),
          Input("heads-run", "value"), Input("heads-metric", "value"), Input("heads-k", "value"),
          Input("heads-compare", "value"), Input("heads-class", "value"),
          Input("heads-fdr", "value"))
@safe
def draw_run(run_id: RunId, metric: Name, top_k: TopK, compare_id: RunId,
             head_class: head_classes.ClassName, fdr: head_classes.Rate):
    if metric is None:
        return no_update, no_update, no_update, no_update, no_update
    run = data.get_run(run_id, shows=SHOWS)
    declared = EXPERIMENTS[run.experiment]
    shown = table_columns(declared)
    scores = _scores(run)
    among("metric", metric, _metrics(scores), "the run's metrics")
    try:
        other = _compared(compare_id)
    except WorkbenchError:  # the comparison says why; this run is still drawn
        other = None
    zrange = shared_range([scores] + ([other] if other is not None else []), metric)
    top = scores[scores.metric == metric].nlargest(top_k or 10, "score")
    rows = top.reindex(columns=shown).round(4).to_dict("records")
    tips = {c: declared.column(c).meaning for c in shown}
    heatmap = style.with_interventions(
        head_scores_figure(scores, metric, run.model_name, run.experiment,
                           metrics.get(metric).meaning, zrange), run.interventions_text)
    note = head_classes.mark(heatmap, run, head_class, fdr)
    return heatmap, rows, [{"name": c, "id": c} for c in shown], tips, note


def _grid_shape(scores: pd.DataFrame) -> tuple[int, int]:
    return int(scores["layer"].max()) + 1, int(scores["head"].max()) + 1


def compare_note(run: Run, other: Run, metric: str, shared: list[str]) -> list:
    """Why the comparison shows what it shows: a metric the other run lacks (with the
    metrics both have, to pick), different models, or grids of heads that do not match."""
    if metric not in set(_scores(other).metric):
        if not shared:
            return [message(f"run {other.id} ({other.experiment}) has no {metric}, and the "
                            "two runs share no metric: nothing to compare")]
        return [message(f"run {other.id} ({other.experiment}) has no {metric}; metrics both "
                        "runs have:"),
                html.Div([html.Button(m, id={"type": "heads-use-metric", "metric": m},
                                      className="wb-export-button") for m in shared],
                         className="wb-export", style={"justifyContent": "flex-start"})]
    notes = []
    if run.model_name != other.model_name:
        notes.append(f"different models ({run.model_name} and {other.model_name}): a head "
                     "at the same layer and index is not the same head")
    shape, other_shape = _grid_shape(_scores(run)), _grid_shape(_scores(other))
    if shape != other_shape:
        notes.append(f"no difference map: {shape[0]} x {shape[1]} heads against "
                     f"{other_shape[0]} x {other_shape[1]}")
    notes.append("both heatmaps share one colour scale")
    return [html.P("; ".join(notes) + ".", className="wb-note")]


@callback(Output("heads-compare-heatmap", "figure"), Output("heads-compare-heatmap-panel", "style"),
          Output("heads-difference", "figure"), Output("heads-difference-panel", "style"),
          Output("heads-compare-note", "children"),
          Input("heads-compare", "value"), Input("heads-metric", "value"),
          Input("heads-run", "value"))
@safe
def draw_compare(compare_id: RunId, metric: Name, run_id: RunId):
    if not compare_id or metric is None:
        return {}, HIDDEN, {}, HIDDEN, None
    run, other = data.get_run(run_id, shows=SHOWS), data.get_run(compare_id, shows=SHOWS)
    scores, theirs = _scores(run), _scores(other)
    among("metric", metric, _metrics(scores), "the run's metrics")
    shared = [m for m in dict.fromkeys(scores.metric) if m in set(theirs.metric)]
    note = compare_note(run, other, metric, shared)
    if metric not in set(theirs.metric):
        return {}, HIDDEN, {}, HIDDEN, note
    zmin, zmax = shared_range([scores, theirs], metric) or (None, None)
    title = f"{metric} · {other.model_name} · {other.experiment} (compared)"
    compared = style.with_interventions(
        style.head_heatmap(theirs, metric, title=title, zmin=zmin, zmax=zmax),
        other.interventions_text)
    if _grid_shape(scores) != _grid_shape(theirs):
        return compared, {}, {}, HIDDEN, note
    diff = difference_figure(scores, theirs, metric, f"{metric}: this run minus the compared")
    return compared, {}, diff, {}, note


@callback(Output("heads-metric", "value", allow_duplicate=True),
          Output("heads-error", "children", allow_duplicate=True),
          Input({"type": "heads-use-metric", "metric": ALL}, "n_clicks"),
          prevent_initial_call=True)
@safe
def use_shared_metric(clicks: Annotated[list[int | None] | None, ListOf(Whole(), 1000)]):
    pressed = triggered()
    if not any(clicks or []) or not isinstance(pressed, dict):
        return no_update, no_update
    # the button's id comes from the client too: the metric is checked like a dropdown's
    return check("metric", Name, pressed.get("metric")), no_update


# A new run drops the head picked in the last one (its grid of heads may be smaller).
@callback(Output("heads-selected", "data"),
          Output("heads-error", "children", allow_duplicate=True),
          Input("heads-heatmap", "clickData"), Input("heads-table", "active_cell"),
          Input("heads-run", "value"), State("heads-table", "derived_viewport_data"),
          prevent_initial_call=True)
@safe
def select_head(click: ClickedHead, cell: HeadCell, run_id: RunId, rows: Annotated[
        list[dict] | None, Records()]):
    source = triggered()
    if source == "heads-run":
        return None, no_update
    if source == "heads-heatmap" and click:
        return {"layer": click[0], "head": click[1]}, no_update
    if source == "heads-table" and cell and rows:
        row = rows[below("table row", cell["row"], len(rows), "rows shown")]
        return {"layer": check("layer", Layer, row.get("layer")),
                "head": check("head", Head, row.get("head"))}, no_update
    return no_update, no_update


def example_prompt(rec: Recording, inputs: str) -> int:
    """The example prompt that matches the inputs a metric was scored on."""
    want = "repeated" if "repeated" in inputs else "natural"
    for i, prompt in enumerate(rec.prompts):
        is_repeated = prompt.label.startswith("repeated")
        if (want == "repeated") == is_repeated:
            return i
    return 0


@callback(Output("heads-example", "figure"),
          Input("heads-selected", "data"), Input("heads-run", "value"),
          Input("heads-metric", "value"), Input("heads-scale", "value"))
@safe
def draw_example(selected: Selected, run_id: RunId, metric: Name, scale: Scale):
    run = data.get_run(run_id, shows=SHOWS)
    scores = _scores(run)
    if metric is None:
        return no_update
    among("metric", metric, _metrics(scores), "the run's metrics")
    picked = scores[scores.metric == metric]
    if picked.empty:
        return no_update
    if not selected:
        best = picked.nlargest(1, "score").iloc[0]
        selected = {"layer": int(best["layer"]), "head": int(best["head"])}
    if not (run.path / "example").is_dir():
        return {}  # the run recorded no example prompts
    rec = data.open_recording(run, "example")
    p = example_prompt(rec, str(picked.inputs.iloc[0]))
    layer = below("layer", selected["layer"], rec.n_layers, "layers in the run's model")
    head = below("head", selected["head"], rec.n_heads, "heads in each layer")
    score = picked[(picked["layer"] == layer) & (picked["head"] == head)].score
    label = f" ({metric} {score.iloc[0]:.2f})" if len(score) else ""
    return style.pattern_heatmap(rec.pattern(p, layer, head), rec.tokens(p),
                                   f"L{layer}H{head} on {rec.prompts[p].label}{label}", scale)


# ---- induction-heads: the causal evidence --------------------------------------------------


@callback(Output("heads-induction", "style"), Output("heads-repeat-loss", "figure"),
          Output("heads-icl", "figure"), Output("heads-ablation", "figure"),
          Output("heads-path-patch", "figure"), Output("heads-path-patch-panel", "style"),
          Input("heads-run", "value"))
@safe
def draw_induction(run_id: RunId):
    run = data.get_run(run_id, shows=SHOWS)
    names = set(run.table_names())
    wanted = (REPEAT_LOSS, LOSS_BY_POSITION, ICL, ABLATION)
    if run.experiment != "induction-heads" or not {t.name for t in wanted} <= names:
        return HIDDEN, no_update, no_update, no_update, no_update, HIDDEN
    repeat, by_position, icl, ablation = (data.table(run, t.name) for t in wanted)
    patch, patch_style = {}, HIDDEN  # runs written before the path patch have no table
    if PATH_PATCH.name in names and len(table := data.table(run, PATH_PATCH.name)):
        patch, patch_style = path_patch_figure(table), {}
    return ({}, repeat_loss_figure(repeat), icl_figure(by_position, icl),
            ablation_figure(ablation), patch, patch_style)
