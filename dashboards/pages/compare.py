"""Compare: two runs of one experiment on one model, side by side.

Pick run A and run B (``?run=A&other=B``); the heading names each run's interventions,
a table puts their configs side by side (the fields that differ first, in bold), the notes say
what could not be compared (a table one run lacks, runs stored before per-prompt values),
and the differences table gives every scalar of every table both runs have, ``B - A``,
with its paired bootstrap interval and, where both runs scored the same prompts, its
sign-flip p-value (:mod:`workbench.harness.compare`, as ``workbench compare A B``). Two
runs that are not of one experiment on one model are refused in the error line."""

from __future__ import annotations

import functools
import math

import dash
from dash import Input, Output, callback, dash_table, html

from dashboards.components import data
from dashboards.components.controls import labelled, run_dropdown, run_search
from dashboards.components.messages import message, one_line, safe, safe_layout
from dashboards.components.values import RunId
from workbench.core.errors import WorkbenchError
from workbench.harness.compare import DIFFERENCE_COLUMNS, Comparison, check_comparable, compare
from workbench.scores import paired
from workbench.store.runs import Run
from workbench.views import pages

KINDS = pages.compared()
run_search("compare-run", KINDS)
run_search("compare-other", KINDS)
# registered with every kind it compares, so the Runs page offers "open in Compare" too; a
# run's own page comes first in the nav (pages.page_for never picks this one)
dash.register_page(__name__, path="/compare", name="Compare",
                   order=pages.order("/compare"), experiments=KINDS)

EMPTY = ("No runs to compare yet. Make two runs of one experiment on one model, e.g. "
         "`workbench run induction-heads --model smollm2` and the same with "
         "`--heads-mask mask.json`.")
ABOUT = (f"Differences are B - A. Intervals: 95% paired bootstrap over prompts "
         f"({paired.N_RESAMPLES} resamples, seed {paired.SEED}); p: two-sided sign-flip test "
         f"({paired.N_FLIPS} draws), where both runs scored the same prompts. Aggregate "
         "rows (a table without per-prompt values) have no interval.")
MEANINGS = {"table": "the stored table", "key": "the row of the table (its keys)",
            "column": "the scalar compared", "a": "mean in run A", "b": "mean in run B",
            "difference": "B - A", "ci_low": "95% interval of the difference, low end",
            "ci_high": "95% interval of the difference, high end",
            "p": "two-sided sign-flip p-value (same prompts only)",
            "n_prompts": "prompts paired", "pairing": "same prompts, different prompts, or "
                                                      "aggregate (no per-prompt values)"}


def _runs() -> list[Run]:
    return [run for run in data.runs() if run.experiment in KINDS]


def _partner(chosen: str, runs: list[Run]) -> str:
    """The run B opens with: the newest other run of A's experiment and model (A itself
    when it has none)."""
    a = next((r for r in runs if r.id == chosen), None)
    if a is None:
        return chosen
    same = [r for r in runs if r.id != a.id and r.experiment == a.experiment
            and r.model_name == a.model_name]
    return same[0].id if same else a.id


@safe_layout("Compare")
def layout(run: str | None = None, other: str | None = None, **_: str) -> html.Div:
    runs = _runs()
    heading = html.H2("Compare", id="compare-title")
    if not runs and run is None:
        return html.Div([heading, html.P(EMPTY, className="wb-note")])
    chosen = data.choose(run, runs, shows=KINDS)
    partner = _partner(chosen, runs) if other is None else data.choose(other, runs,
                                                                       shows=KINDS)
    return html.Div([
        heading, html.Div(id="compare-error"),
        html.Div(className="wb-controls", children=[
            labelled("run A", run_dropdown("compare-run", runs, chosen), "34em"),
            labelled("run B", run_dropdown("compare-other", runs, partner), "34em")]),
        html.H3("Configs and interventions"),
        dash_table.DataTable(id="compare-config", page_size=60, style_cell=CELL,
                             columns=[{"name": n, "id": n} for n in ("field", "a", "b")],
                             style_data_conditional=[{"if": {"filter_query": "{differs} = 1"},
                                                      "fontWeight": "bold"}]),
        html.Ul(id="compare-notes", className="wb-note"),
        html.H3("Differences, B - A"), html.P(ABOUT, className="wb-note"),
        dash_table.DataTable(id="compare-differences", page_size=25, sort_action="native",
                             filter_action="native", style_cell=CELL,
                             columns=[{"name": c, "id": c} for c in DIFFERENCE_COLUMNS],
                             tooltip_header=MEANINGS),
    ])


CELL = {"fontSize": "0.85em", "textAlign": "left", "maxWidth": "28em", "overflow": "hidden",
        "textOverflow": "ellipsis"}


@functools.lru_cache(maxsize=8)
def _compared(root: str, a: str, b: str) -> Comparison:
    """One comparison, kept: finished runs do not change, and a bootstrap over every
    position of every window takes a moment."""
    del root  # part of the key only: two stores may hold runs of one id
    return compare(data.get_run(a, shows=KINDS), data.get_run(b, shows=KINDS))


def _shown(value: object) -> object:
    """A number as the table shows it: four significant digits; NaN as empty."""
    if isinstance(value, float):
        return None if math.isnan(value) else float(f"{value:.4g}")
    return value


@callback(Output("compare-title", "children"), Output("compare-config", "data"),
          Output("compare-notes", "children"), Output("compare-differences", "data"),
          Output("compare-error", "children"),
          Input("compare-run", "value"), Input("compare-other", "value"))
@safe
def draw(run_id: RunId, other_id: RunId):
    if run_id is None or other_id is None:
        return "Compare", [], [], [], None
    try:  # refused before any work, and nothing of an earlier pair left on the page
        check_comparable(data.get_run(run_id, shows=KINDS), data.get_run(other_id,
                                                                         shows=KINDS))
    except WorkbenchError as exc:
        return "Compare", [], [], [], message(one_line(exc))
    result = _compared(str(data.store().root), run_id, other_id)
    inter_a, inter_b = result.interventions
    title = (f"Compare {result.a.experiment} on {result.a.model_name}: A ({inter_a}) vs "
             f"B ({inter_b})")
    config = [{"field": "interventions", "a": inter_a, "b": inter_b,
               "differs": int(inter_a != inter_b)}]
    fields = result.config.sort_values("differs", ascending=False, kind="stable")
    config += [{**row, "differs": int(row["differs"])} for row in fields.to_dict("records")]
    rows = [{k: _shown(v) for k, v in row.items()}
            for row in result.differences.to_dict("records")]
    return title, config, [html.Li(n) for n in result.notes], rows, None
