"""Formation: loss and in-context learning over training with the phase change shaded, every
head's induction and previous-token score over training, and a slider over checkpoints that
shows a head's attention on a repeated sequence as the induction stripe forms.

Everything shown is read from the run's tables, by their declarations in
``experiments/induction_formation/tables.py``."""

from __future__ import annotations

import dash
import pandas as pd
from dash import Input, Output, callback, dcc, html, no_update

from dashboards.components import data, exports
from dashboards.components.controls import labelled, run_search
from dashboards.components.messages import message, safe, safe_layout
from dashboards.components.skeleton import run_page
from dashboards.components.values import Index, Name, NamedHead, RunId, among, below
from experiments.induction_formation.tables import (
    CHECKPOINT_PATTERNS,
    HEAD_SCORES,
    PATTERN_TOKENS,
    PHASE_CHANGE,
    TRAINING_CURVE,
)
from workbench.store.schema import Table
from workbench.views import curves, pages, style

SHOWS = pages.shows("/formation")
run_search("formation-run", SHOWS)
dash.register_page(__name__, path="/formation", name="Formation",
                   order=pages.order("/formation"), experiments=SHOWS)

EMPTY = "No training runs yet. Train the models with `workbench run induction-formation`."


@safe_layout("Formation")
def layout(run: str | None = None, **_: str) -> html.Div:
    return run_page("formation", "Formation", shows=SHOWS, requested=run, empty=EMPTY,
                    controls=[
        labelled("model", dcc.Dropdown(id="formation-model", clearable=False)),
        labelled("head", dcc.Dropdown(id="formation-head", clearable=False), "10em"),
    ], body=lambda chosen: [
        html.P(id="formation-summary", className="wb-note"),
        exports.graph("formation-curves", chosen),
        exports.graph("formation-heads", chosen),
        html.Div([html.Label("checkpoint (training step)"),
                  # the value is the checkpoint's index; the marks show its step
                  dcc.Slider(id="formation-step", min=0, max=0, step=1, value=0,
                             marks=None, allow_direct_input=False)],
                 className="wb-control", style={"maxWidth": "60em"}),
        exports.graph("formation-pattern", chosen),
    ])


exports.follow("formation-run", page="formation",
               graphs=["formation-curves", "formation-heads", "formation-pattern"])


def _table(run_id: str, table: Table) -> pd.DataFrame:
    """A stored table with exactly its declared columns (one a run did not write, such as
    the phase-change window of an older run that found none, is all missing)."""
    return data.table(data.get_run(run_id, shows=SHOWS), table.name).reindex(columns=table.names)


def _steps(run_id: str, model: str) -> list[int]:
    curve = _table(run_id, TRAINING_CURVE)
    return sorted(curve[curve.model == model].step.unique().tolist())


def _models(phase: pd.DataFrame) -> list[str]:
    """The models the run trained, smallest first (one ``phase_change`` row each)."""
    return phase.sort_values("n_layers").model.tolist()


def _check_model(run_id: str, model: str) -> str:
    """``model`` if the run trained it.

    Raises:
        Refused: it did not.
    """
    return among("model", model, _models(_table(run_id, PHASE_CHANGE)), "the run's models")


@callback(Output("formation-model", "options"), Output("formation-model", "value"),
          Output("formation-error", "children"), Input("formation-run", "value"))
@safe
def choose_run(run_id: RunId):
    phase = _table(run_id, PHASE_CHANGE)
    models = _models(phase)
    if not models:
        return [], None, message(f"run {run_id} trained no models")
    detected = phase[phase.detected].model.tolist()
    return models, (detected or models)[-1], None


@callback(Output("formation-head", "options"), Output("formation-head", "value"),
          Output("formation-step", "max"), Output("formation-step", "marks"),
          Output("formation-step", "value"),
          Output("formation-error", "children", allow_duplicate=True),
          Input("formation-run", "value"), Input("formation-model", "value"),
          prevent_initial_call="initial_duplicate")
@safe
def choose_model(run_id: RunId, model: Name):
    if model is None:
        return (no_update,) * 6
    _check_model(run_id, model)
    scores = _table(run_id, HEAD_SCORES)
    final = scores[(scores.model == model) & (scores.metric == "induction")]
    final = final[final.step == final.step.max()]
    heads = [f"L{r.layer}H{r.head}" for r in final.sort_values(["layer", "head"]).itertuples()]
    best = final.loc[final.score.idxmax()]
    steps = _steps(run_id, model)
    every = max(1, len(steps) // 10)
    marks = {i: str(s) for i, s in enumerate(steps) if i % every == 0 or i == len(steps) - 1}
    return (heads, f"L{int(best['layer'])}H{int(best['head'])}", len(steps) - 1, marks, 0,
            no_update)


def _phase(run_id: str, model: str) -> pd.Series:
    phase = _table(run_id, PHASE_CHANGE)
    return phase[phase.model == model].iloc[0]


@callback(Output("formation-curves", "figure"), Output("formation-summary", "children"),
          Input("formation-run", "value"), Input("formation-model", "value"))
@safe
def draw_curves(run_id: RunId, model: Name):
    if model is None:
        return no_update, no_update
    _check_model(run_id, model)
    phase = _phase(run_id, model)
    fig = curves.formation_curves(_table(run_id, TRAINING_CURVE), phase, model)
    return fig, _describe(phase)


def _describe(row: pd.Series) -> str:
    """What the run found for one model, in a line, from its ``phase_change`` row."""
    repeat = (f"loss on the second repeat {row.second_repeat_final:.2f} nats against "
              f"{row.first_repeat_final:.2f} on the first")
    if not bool(row.detected):
        return (f"{row.model}: no phase change; the best head's induction score went from "
                f"{row.induction_initial:.2f} to {row.induction_final:.2f}; {repeat}.")
    jump = "inside" if bool(row.icl_jump_in_window) else "outside"
    # loss_bump is missing when the test could not run (too few checkpoints around)
    tested = not pd.isna(row.loss_bump)
    bump = (f"a loss bump at step {int(row.loss_bump_step)}" if tested and bool(row.loss_bump)
            else "no loss bump" if tested else "no test of a loss bump")
    return (f"{row.model}: induction heads formed between steps {int(row.start_step)} and "
            f"{int(row.end_step)} (best head {row.induction_before:.2f} to "
            f"{row.induction_after:.2f}); the steepest ICL gain ({row.icl_jump_start}-"
            f"{row.icl_jump_end}) lies {jump} that window, with {bump}; {repeat}.")


@callback(Output("formation-heads", "figure"),
          Input("formation-run", "value"), Input("formation-model", "value"))
@safe
def draw_heads(run_id: RunId, model: Name):
    if model is None:
        return no_update
    _check_model(run_id, model)
    return curves.formation_heads(_table(run_id, HEAD_SCORES), _phase(run_id, model), model)


@callback(Output("formation-pattern", "figure"),
          Input("formation-run", "value"), Input("formation-model", "value"),
          Input("formation-head", "value"), Input("formation-step", "value"))
@safe
def draw_pattern(run_id: RunId, model: Name, head: NamedHead, checkpoint: Index):
    if model is None or head is None or checkpoint is None:
        return no_update
    _check_model(run_id, model)
    steps = _steps(run_id, model)
    step = steps[below("checkpoint", checkpoint, len(steps), f"checkpoints of {model}")]
    patterns = _table(run_id, CHECKPOINT_PATTERNS)
    mine = patterns[patterns.model == model]
    layer, h = head
    labels = [f"L{a}H{b}" for a, b in sorted(set(zip(mine.layer, mine["head"], strict=True)))]
    among("head", f"L{layer}H{h}", labels, f"the heads of {model}")
    one = mine[(mine.step == step) & (mine.layer == layer) & (mine["head"] == h)]
    tokens = _table(run_id, PATTERN_TOKENS).sort_values("position").token.tolist()
    return style.pattern_heatmap(style.pattern_from_rows(one, len(tokens)), tokens,
                                   f"{model} L{layer}H{h} at step {step} "
                                   "(a random sequence, repeated)")
