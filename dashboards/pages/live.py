"""Live: type or paste a prompt, pick a model, and see its heads.

The server records the prompt (:class:`workbench.harness.live.LiveQueue`: at most
:data:`~workbench.harness.live.MAX_TOKENS` tokens, one job at a time per model, the
reader's place in the line shown, cancellable) into an ordinary ``record`` run, which also
opens on the Recording page and is shared by its id. The page then draws the pattern of a
head with the Recording page's own figure, every pattern metric of every head for this
prompt, and the chosen query's row; it opens on the head with the largest
previous-token score and on the last query. ``/live?run=ID`` opens any complete
recording's heads the same way. On a host that is not loopback the page is
off unless the dashboard was started with ``--allow-live``.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Annotated

import dash
import pandas as pd
from dash import Input, Output, State, callback, dcc, html, no_update

from dashboards.components import data, exports, links
from dashboards.components.controls import labelled
from dashboards.components.messages import message, safe, safe_layout
from dashboards.components.values import (
    ClickedHead,
    Clicks,
    Head,
    Index,
    Layer,
    Name,
    Passage,
    RunId,
    Text,
    among,
    below,
    triggered,
)
from experiments.qk_attribution.tables import SCORES as WHY_SCORES
from workbench.core.errors import WorkbenchError
from workbench.harness import live
from workbench.inputs.prompts import CHARS_PER_TOKEN, Prompt, file_sets, load_prompt_set
from workbench.recording.reader import Recording
from workbench.scores import metrics
from workbench.views import pages, style
from workbench.views.patterns import query_bars

SHOWS = pages.shows("/live")
dash.register_page(__name__, path="/live", name="Live",
                   order=pages.order("/live"), experiments=SHOWS)

PromptText = Annotated[str | None, Passage(max_chars=CHARS_PER_TOKEN * live.MAX_TOKENS)]
"""The text area's prompt: its length in tokens is the queue's to check."""
JobId = Annotated[str | None, Text(max_chars=64)]
"""A live job's id, as the queue gave it."""
POLL_MS = 300
PATTERN_METRICS = [name for name, m in metrics.METRICS.items() if m.kind == "pattern"]
"""The metrics the page scores: every metric of the registry that is a function of one
pattern."""
NOTE = (f"The server records your prompt (at most {live.MAX_TOKENS} tokens) into an ordinary "
        "record run: one job at a time per model, yours shown with its place in the line. "
        "The run also opens on the Recording page, and its link can be shared.")


@safe_layout("Live")
def layout(run: str | None = None, **_: str) -> html.Div:
    heading = html.H2("Live: type a prompt, see its heads")
    try:
        models = list(data.live_queue().models())
    except WorkbenchError as exc:
        return html.Div([heading, message(str(exc))], id="live-off")
    opened = None if run is None else data.get_run(run, shows=SHOWS).id  # ?run=: its heads
    return html.Div([
        heading, html.P(NOTE, className="wb-note"), html.Div(id="live-error"),
        html.Div(className="wb-controls", children=[
            labelled("model", dcc.Dropdown(id="live-model", options=models, value=models[0],
                                           clearable=False), "22em"),
            labelled("or a prompt of a set", dcc.Dropdown(id="live-set",
                                                          options=sorted(file_sets())),
                     "12em"),
            labelled("prompt", dcc.Dropdown(id="live-prompt"), "28em"),
        ]),
        dcc.Textarea(id="live-text", placeholder="Type or paste a prompt",
                     style={"width": "100%", "height": "6em"}),
        html.Div(className="wb-controls", children=[
            html.Button("Record", id="live-submit", n_clicks=0),
            html.Button("Cancel", id="live-cancel", n_clicks=0),
            html.Div(id="live-status", className="wb-note"),
        ]),
        dcc.Store(id="live-job"), dcc.Store(id="live-run", data=opened),
        dcc.Interval(id="live-poll", interval=POLL_MS, disabled=True),
        html.Div(id="live-result", style={"display": "none"}, children=_result()),
    ])


def _result() -> list:
    return [
        html.Div(className="wb-controls", children=[
            labelled("layer", dcc.Dropdown(id="live-layer", clearable=False)),
            labelled("head", dcc.Dropdown(id="live-head", clearable=False)),
            labelled("query", dcc.Dropdown(id="live-query", clearable=False), "16em"),
            labelled("scores of", dcc.Dropdown(id="live-metric", options=PATTERN_METRICS,
                                               value=live.DEFAULT_METRIC, clearable=False),
                     "14em"),
        ]),
        html.Div(id="live-links", className="wb-note"),
        html.Div(className="wb-row", children=[exports.graph("live-pattern"),
                                               exports.graph("live-scores")]),
        exports.graph("live-row"),
    ]


@callback(Output("live-prompt", "options"), Output("live-prompt", "value"),
          Output("live-error", "children", allow_duplicate=True),
          Input("live-set", "value"), prevent_initial_call=True)
@safe
def choose_set(name: Name):
    if name is None:
        return [], None, None
    among("prompt set", name, sorted(file_sets()), "the prompt sets of data/prompts")
    prompts = load_prompt_set(name)
    options = [{"label": f"{i}: {_text(p)[:60]}", "value": i} for i, p in enumerate(prompts)]
    return options, None, None


def _text(prompt: Prompt) -> str:
    return " ".join(part for part in (prompt.text, prompt.pair) if part)


@callback(Output("live-text", "value"), Output("live-error", "children", allow_duplicate=True),
          Input("live-prompt", "value"), State("live-set", "value"), prevent_initial_call=True)
@safe
def choose_prompt(index: Index, name: Name):
    if index is None or name is None:
        return no_update, no_update
    among("prompt set", name, sorted(file_sets()), "the prompt sets of data/prompts")
    prompts = load_prompt_set(name)
    return _text(prompts[below("prompt", index, len(prompts), "prompts in the set")]), None


@callback(Output("live-job", "data"), Output("live-poll", "disabled"),
          Output("live-status", "children"), Output("live-error", "children"),
          Input("live-submit", "n_clicks"), State("live-model", "value"),
          State("live-text", "value"), prevent_initial_call=True)
@safe
def submit(clicks: Clicks, model: Name, prompt: PromptText):
    if not clicks:
        return no_update, no_update, no_update, no_update
    status = data.live_queue().submit(model or "", prompt or "", device=data.live_device())
    return status.id, False, _said(status), None


@callback(Output("live-status", "children", allow_duplicate=True),
          Output("live-poll", "disabled", allow_duplicate=True),
          Output("live-run", "data"), Output("live-error", "children", allow_duplicate=True),
          Input("live-poll", "n_intervals"), State("live-job", "data"),
          prevent_initial_call=True)
@safe
def poll(ticks: Index, job_id: JobId):
    if job_id is None:
        return no_update, True, no_update, no_update
    status = data.live_queue().status(job_id)
    if not status.done:
        return _said(status), False, no_update, no_update
    run = status.run_id if status.state == "complete" else no_update
    return _said(status), True, run, None


@callback(Output("live-status", "children", allow_duplicate=True),
          Input("live-cancel", "n_clicks"), State("live-job", "data"),
          prevent_initial_call=True)
@safe
def cancel(clicks: Clicks, job_id: JobId):
    if not clicks or job_id is None:
        return no_update
    return _said(data.live_queue().cancel(job_id))


def _said(status: live.JobStatus) -> list:
    """The job's state as the reader reads it."""
    match status.state:
        case "queued":
            return [f"waiting: number {status.position} in the line for {status.model}"]
        case "running":
            return [f"running on {status.model}: {status.stage}"]
        case "complete":
            assert status.run_id is not None
            return [f"recorded in {status.seconds:.1f} s: run ",
                    html.A(status.run_id, href=links.run_link(status.run_id, "record"),
                           id="live-run-link")]
    said = [message(f"{status.state}: {status.error}")]
    if status.run_id is not None:
        said.append(html.Span(["its run: ", html.A(status.run_id, href=links.run_link(
            status.run_id, "record"))]))
    return said


@lru_cache(maxsize=32)
def _scores_of(folder: str, mtime_ns: int, metric: str) -> pd.DataFrame:
    return live.pattern_scores(Recording.open(folder), names=[metric])


def scores(rec: Recording, metric: str) -> pd.DataFrame:
    """One pattern metric of every head on the recording's prompt (computed once; one
    metric at a time, as the page shows them, so the first figure waits for one)."""
    return _scores_of(str(rec.root), (rec.root / "index.json").stat().st_mtime_ns, metric)


@callback(Output("live-layer", "options"), Output("live-layer", "value"),
          Output("live-head", "options"), Output("live-head", "value"),
          Output("live-query", "options"), Output("live-query", "value"),
          Output("live-result", "style"), Output("live-error", "children", allow_duplicate=True),
          Input("live-run", "data"), Input("live-scores", "clickData"),
          State("live-query", "value"), prevent_initial_call="initial_duplicate")
@safe
def open_run(run_id: RunId, click: ClickedHead, query: Index):
    if run_id is None:
        return (no_update,) * 8
    rec = data.recording(run_id)
    n = rec.length(0)
    if triggered() == "live-scores" and click:
        layer, head = click
        below("layer", layer, rec.n_layers, "layers in the recording")
        below("head", head, rec.n_heads, "heads in each layer")
    else:
        layer, head = live.opening_head(scores(rec, live.DEFAULT_METRIC))
        query = n - 1
    queries = [{"label": f"{q}: {t!r}"[:40], "value": q} for q, t in enumerate(rec.tokens(0))]
    return (list(range(rec.n_layers)), layer, list(range(rec.n_heads)), head, queries,
            query if query is not None and query < n else n - 1, {"display": "block"}, None)


@callback(Output("live-scores", "figure"), Input("live-run", "data"),
          Input("live-metric", "value"))
@safe
def draw_scores(run_id: RunId, metric: Name):
    if run_id is None or metric is None:
        return no_update
    among("metric", metric, PATTERN_METRICS, "the pattern metrics")
    rec = data.recording(run_id)
    table = scores(rec, metric)
    meaning = metrics.get(metric).meaning
    bounded = metrics.get(metric).bounded
    return style.head_heatmap(table, metric, title=f"{metric}: {meaning}<br>click a head "
                                "to open it", zmin=0 if bounded else None,
                                zmax=1 if bounded else None,
                                layer_types=rec.model.layer_types)


@callback(Output("live-pattern", "figure"), Output("live-row", "figure"),
          Output("live-links", "children"),
          Input("live-run", "data"), Input("live-layer", "value"), Input("live-head", "value"),
          Input("live-query", "value"))
@safe
def draw_head(run_id: RunId, layer: Layer, head: Head, query: Index):
    if run_id is None or layer is None or head is None or query is None:
        return no_update, no_update, no_update
    rec = data.recording(run_id)
    below("layer", layer, rec.n_layers, "layers in the recording")
    below("head", head, rec.n_heads, "heads in each layer")
    q = below("query", query, rec.length(0), "positions in the prompt")
    tokens = rec.tokens(0)
    pattern = rec.pattern(0, layer, head)
    name = f"L{layer}H{head}"
    heatmap = style.pattern_heatmap(pattern, tokens, f"layer {layer}, head {head} ({name})")
    return heatmap, query_bars(pattern[q], tokens, q, name), _links(rec, run_id, layer, head)


def _links(rec: Recording, run_id: str, layer: int, head: int) -> list:
    """The run on the Recording page, and why the head attends where it does: a
    qk-attribution run of this model that explains it, else the command that makes one."""
    name = f"L{layer}H{head}"
    parts: list = ["Open this run on the ",
                   html.A("Recording page", href=links.run_link(run_id, "record"),
                          id="live-recording-link"), ". "]
    for run in data.runs("qk-attribution"):
        if run.model_name != rec.model.name:
            continue
        explained = data.table(run, WHY_SCORES.name)
        if ((explained.layer == layer) & (explained["head"] == head)).any():
            return [*parts, f"Why does {name} attend here? ",
                    html.A(f"qk-attribution run {run.id}", id="live-why-link",
                           href=links.run_link(run.id, "qk-attribution")),
                    f" explains it (choose {name} there)."]
    return [*parts, f"Why does {name} attend here? The ", html.A(
        "Why page", href=dash.get_relative_path("/why"), id="live-why-link"),
        " explains it after ", html.Code(f"workbench run qk-attribution --model "
                                         f"{rec.model.name} --set heads={name}"), "."]
