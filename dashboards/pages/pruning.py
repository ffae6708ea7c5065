"""Pruning: head importance, pruning curves against random orders, the mask at a budget,
and when each head was pruned; figures first, the run's ~30 summary lines (one per kind
of head and metric) last, in a collapsed section."""

from __future__ import annotations

from typing import Annotated

import dash
import numpy as np
import pandas as pd
from dash import Input, Output, callback, dash_table, dcc, html, no_update

from dashboards.components import data, exports
from dashboards.components.controls import labelled, run_search
from dashboards.components.messages import safe, safe_layout
from dashboards.components.skeleton import run_page
from dashboards.components.values import ClickedHead, Name, Real, RunId, among, below, triggered
from experiments.head_pruning.tables import (
    HEAD_SCORES,
    KIND_EXPERIMENTS,
    MASKS,
    PRUNING_CURVE,
    PRUNING_ORDER,
    SPEEDUP,
    SURVIVAL,
)
from workbench.views import curves, pages, style

SHOWS = pages.shows("/pruning")
run_search("pruning-run", SHOWS)
dash.register_page(__name__, path="/pruning", name="Pruning",
                   order=pages.order("/pruning"), experiments=SHOWS)

EMPTY = "No head-pruning runs yet: `workbench run head-pruning --model minilm`."
TABLE_STYLE = {"fontSize": "0.85em", "textAlign": "left"}
Budget = Annotated[float | None, Real(0, 1)]
"""A fraction of the heads kept (the budget dropdown's values)."""


@safe_layout("Pruning")
def layout(run: str | None = None, **_: str) -> html.Div:
    return run_page("pruning", "Pruning", shows=SHOWS, requested=run, empty=EMPTY, controls=[
        labelled("importance", dcc.Dropdown(id="pruning-kind", clearable=False), "16em"),
        labelled("metric", dcc.Dropdown(id="pruning-metric", clearable=False), "16em"),
        labelled("budget", dcc.Dropdown(id="pruning-budget", clearable=False)),
        labelled("order", dcc.Dropdown(id="pruning-order", clearable=False), "16em"),
    ], body=lambda chosen: [
        html.Div(className="wb-row", children=[exports.graph("pruning-importance", chosen),
                                               exports.graph("pruning-curves", chosen)]),
        html.Div(className="wb-row", children=[exports.graph("pruning-mask", chosen),
                                               exports.graph("pruning-survival", chosen)]),
        html.P("Click a head in the importance or survival map to see its history.",
               id="pruning-head", className="wb-note"),
        html.H3("Which kinds of heads survive"),
        html.Div(id="pruning-kinds"),
        html.H3("Heads removed from the weights"),
        html.Div(id="pruning-speed"),
        html.Details(id="pruning-summary-box", children=[
            html.Summary("the run's summary", id="pruning-summary-title"),
            html.Ul(id="pruning-summary", className="wb-note")]),
    ])


exports.follow("pruning-run", page="pruning", graphs=[
    "pruning-importance", "pruning-curves", "pruning-mask", "pruning-survival"])


@callback(Output("pruning-kind", "options"), Output("pruning-kind", "value"),
          Output("pruning-metric", "options"), Output("pruning-metric", "value"),
          Output("pruning-budget", "options"), Output("pruning-budget", "value"),
          Output("pruning-order", "options"), Output("pruning-order", "value"),
          Output("pruning-summary", "children"), Output("pruning-summary-title", "children"),
          Output("pruning-error", "children"),
          Input("pruning-run", "value"))
@safe
def choose_run(run_id: RunId):
    run = data.get_run(run_id, shows=SHOWS)
    kinds = sorted(data.table(run, HEAD_SCORES.name).metric.unique())
    curve = data.table(run, PRUNING_CURVE.name)
    metrics = list(dict.fromkeys(curve.metric))
    budgets = [{"label": f"{b:.0%}", "value": float(b)}
               for b in sorted(data.table(run, MASKS.name).budget.unique())]
    orders = _orders(curve)
    summary = [html.Li(line) for line in run.meta.summary]
    return (kinds, "importance_gradient" if "importance_gradient" in kinds else kinds[0],
            metrics, metrics[0], budgets, budgets[0]["value"] if budgets else None,
            orders, orders[0], summary, f"the run's summary ({len(summary)} lines)", None)


@callback(Output("pruning-importance", "figure"),
          Input("pruning-run", "value"), Input("pruning-kind", "value"))
@safe
def draw_importance(run_id: RunId, kind: Name):
    if kind is None:
        return no_update
    run = data.get_run(run_id, shows=SHOWS)
    scores = data.table(run, HEAD_SCORES.name)
    among("importance", kind, sorted(scores.metric.unique()), "the run's importances")
    return style.head_heatmap(scores, kind,
                                title=f"{kind} · {run.model_name} (unpruned model)")


@callback(Output("pruning-curves", "figure"),
          Input("pruning-run", "value"), Input("pruning-metric", "value"))
@safe
def draw_curves(run_id: RunId, metric: Name):
    if metric is None:
        return no_update
    run = data.get_run(run_id, shows=SHOWS)
    curve = data.table(run, PRUNING_CURVE.name)
    among("metric", metric, list(dict.fromkeys(curve.metric)), "the run's metrics")
    return curves.pruning_curves(curve, metric, run.model_name or "")


@callback(Output("pruning-mask", "figure"),
          Input("pruning-run", "value"), Input("pruning-budget", "value"))
@safe
def draw_mask(run_id: RunId, budget: Budget):
    if budget is None:
        return no_update
    masks = data.table(data.get_run(run_id, shows=SHOWS), MASKS.name)
    at = masks[np.isclose(masks.budget, budget)]
    if at.empty:
        among("budget", budget, sorted(masks.budget.unique().tolist()), "the run's budgets")
    scores = at.assign(metric="keep", score=at.keep)
    title = (f"mask at budget {budget:.0%} ({at.order.iloc[0]} order): "
             f"{int(at.keep.sum())} of {len(at)} heads kept")
    return style.head_heatmap(scores, "keep", title=title, zmin=0, zmax=1,
                                colorscale="Blues")


def _survival_scores(order: pd.DataFrame) -> pd.DataFrame:
    """Each head's pruning step; heads never pruned get one step past the last."""
    never = int(order.step.max()) + 1 if order.step.notna().any() else 1
    return order.assign(metric="step", score=order.step.astype(float).fillna(never))


def _orders(table: pd.DataFrame) -> list[str]:
    """The importance orders of a table, without the random ones."""
    return [o for o in dict.fromkeys(table.order) if o != "random"]


@callback(Output("pruning-survival", "figure"),
          Input("pruning-run", "value"), Input("pruning-order", "value"))
@safe
def draw_survival(run_id: RunId, order: Name):
    if order is None:
        return no_update
    table = data.table(data.get_run(run_id, shows=SHOWS), PRUNING_ORDER.name)
    among("order", order, _orders(table), "the run's orders")
    mine = table[table.order == order]
    scores = _survival_scores(mine)
    last = int(scores.score.max())
    return style.head_heatmap(scores, "step", colorscale="Viridis", title=(
        f"pruning step of each head ({order} order; {last} = never pruned)"))


@callback(Output("pruning-head", "children"),
          Input("pruning-importance", "clickData"), Input("pruning-survival", "clickData"),
          Input("pruning-run", "value"), Input("pruning-order", "value"))
@safe
def describe_head(importance_click: ClickedHead, survival_click: ClickedHead, run_id: RunId,
                  order: Name):
    trigger = triggered()
    click = survival_click if trigger == "pruning-survival" else importance_click
    if trigger not in ("pruning-importance", "pruning-survival") or not click:
        return "Click a head in the importance or survival map to see its history."
    layer, head = click
    run = data.get_run(run_id, shows=SHOWS)
    scores = data.table(run, HEAD_SCORES.name)
    below("layer", layer, int(scores.layer.max()) + 1, "layers in the run's model")
    below("head", head, int(scores["head"].max()) + 1, "heads in each layer")
    return head_history(data.table(run, PRUNING_ORDER.name), scores, layer, head)


def head_history(order: pd.DataFrame, scores: pd.DataFrame, layer: int, head: int) -> str:
    """One line: when the head was pruned in every order, and its importances."""
    mine = order[(order.layer == layer) & (order["head"] == head)]
    parts = []
    for row in mine.itertuples():
        name = row.order if pd.isna(row.seed) else f"random seed {row.seed}"
        parts.append(f"{name}: never pruned" if pd.isna(row.step) else
                     f"{name}: step {row.step} ({row.fraction_pruned:.0%} pruned)")
    imp = scores[(scores.layer == layer) & (scores["head"] == head)]
    values = [f"{r.metric} {r.score:.3g}" for r in imp.itertuples()]
    return f"L{layer}H{head} — " + "; ".join(parts) + " — " + ", ".join(values)


@callback(Output("pruning-kinds", "children"), Input("pruning-run", "value"))
@safe
def draw_kinds(run_id: RunId):
    """The run's join with the head-finding and sink runs it found on the same weights."""
    survival = data.table(data.get_run(run_id, shows=SHOWS), SURVIVAL.name)
    if survival.empty:
        return html.P(f"No complete run of {', '.join(KIND_EXPERIMENTS)} on these weights "
                      "when this run was made.", className="wb-note")
    return [html.P(f"Top heads of each metric of the newest runs of "
                   f"{', '.join(sorted(set(survival.experiment)))} on these weights, in the "
                   f"{survival.order.iloc[0]} order: survival 1 = pruned last, 0.5 = what "
                   "chance gives.", className="wb-note"),
            _table("pruning-kinds-table", survival[SURVIVAL.names].round(3))]


SPEED_SHOWN = ["budget", "n_removed", "speedup", "speedup range", "seconds_full",
               "full range", "seconds_removed", "removed range", "repeats", "load", "busy",
               "max_abs_diff", "batch_tokens", "skipped"]


def _range(low: float, high: float) -> str:
    return "-" if low != low or high != high else f"{low:.3g} to {high:.3g}"


def speed_rows(speed: pd.DataFrame) -> pd.DataFrame:
    """The speed-up table as the page shows it: each median beside its range, the load
    before and after the timings and whether it was busy. A run written before the
    timings had ranges (one fastest time each) shows ``-`` for them."""
    speed = speed.reindex(columns=SPEEDUP.names)
    def ranged(name: str) -> list[str]:
        return [_range(lo, hi) for lo, hi in zip(speed[f"{name}_low"], speed[f"{name}_high"],
                                                 strict=True)]
    return pd.DataFrame({
        "budget": speed.budget, "n_removed": speed.n_removed,
        "speedup": speed.speedup.round(3), "speedup range": ranged("speedup"),
        "seconds_full": speed.seconds_full.round(4), "full range": ranged("seconds_full"),
        "seconds_removed": speed.seconds_removed.round(4),
        "removed range": ranged("seconds_removed"),
        "repeats": speed.repeats.fillna(-1).astype(int).astype(str).replace("-1", "-"),
        "load": [_range(a, b).replace(" to ", " then ") for a, b in
                 zip(speed.load_before, speed.load_after, strict=True)],
        "busy": ["-" if b is None or b != b else ("busy" if b else "idle") for b in speed.busy],
        "max_abs_diff": speed.max_abs_diff, "batch_tokens": speed.batch_tokens,
        "skipped": speed.skipped}, columns=SPEED_SHOWN)


@callback(Output("pruning-speed", "children"), Input("pruning-run", "value"))
@safe
def draw_speed(run_id: RunId):
    speed = data.table(data.get_run(run_id, shows=SHOWS), SPEEDUP.name)
    if speed.empty:
        return html.P("Not measured in this run.", className="wb-note")
    shown = speed_rows(speed)
    note = ("The median of interleaved pairs (full, then removed, back to back), with the "
            "range of the pairs; the load is the machine's 1-minute load average before "
            "then after the timings.")
    if (shown.busy == "busy").any():
        note += (" Busy: the load was above the machine's cores, so these times include "
                 "waiting for the cores and the speed-up is not the model's own.")
    return [html.P(note, className="wb-note", id="pruning-speed-note"),
            _table("pruning-speed-table", shown)]


def _table(component_id: str, df: pd.DataFrame) -> dash_table.DataTable:
    return dash_table.DataTable(id=component_id, data=df.to_dict("records"),
                                columns=[{"name": c, "id": c} for c in df.columns],
                                sort_action="native", page_size=15, style_cell=TABLE_STYLE)
