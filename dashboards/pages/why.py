"""Why: why a head attends where it does, from a qk-attribution run.

Pick a run, a head, a prompt and a query: the token strip shows the query's attention row
(the explained key outlined), the bars split the score on that key over the upstream
components that wrote the key (key side) and the query (query side), grouped by layer,
the pair matrix crosses the top components of both sides, and the last figure is the mean
over every prompt with its 95% bootstrap interval. Everything is read from the run's
tables by the names ``experiments/qk_attribution/tables.py`` declares.
"""

from __future__ import annotations

import dash
import pandas as pd
from dash import Input, Output, State, callback, dcc, html, no_update

from dashboards.components import data, exports, links
from dashboards.components.controls import labelled, run_search
from dashboards.components.messages import safe, safe_layout
from dashboards.components.skeleton import run_page
from dashboards.components.values import Index, Name, NamedHead, RunId, among
from experiments.qk_attribution.tables import (
    ATTRIBUTION,
    PAIR_CONTRIBUTIONS,
    PAIR_MATRIX,
    PATTERNS,
    SCORES,
    SOURCES,
    TOKENS,
)
from workbench.store.runs import Run
from workbench.views import pages
from workbench.views.qk import (
    aggregate_figure,
    bars_figure,
    head_label,
    matrix_figure,
    pair_title,
    strip_figure,
)

SHOWS = pages.shows("/why")
run_search("why-run", SHOWS)
dash.register_page(__name__, path="/why", name="Why",
                   order=pages.order("/why"), experiments=SHOWS)

EMPTY = ("No qk-attribution runs yet. Make one with "
         "`workbench run qk-attribution --model smollm2`.")
MARGIN = {"l": 10, "r": 10, "t": 50, "b": 10}
GRAPHS = ["why-strip", "why-key", "why-query", "why-pairs", "why-aggregate"]


@safe_layout("Why")
def layout(run: str | None = None, head: str | None = None, **_: str) -> html.Div:
    """``?head=LxHy`` opens on that head where the run explains it (the Circuit page's
    links ask for one)."""
    return run_page("why", "Why does this head attend here?", shows=SHOWS, requested=run,
                    empty=EMPTY, after=[dcc.Store(id="why-asked-head", data=head)],
                    controls=[
        labelled("head", dcc.Dropdown(id="why-head", clearable=False), "10em"),
        labelled("prompt", dcc.Dropdown(id="why-prompt", clearable=False), "10em"),
        labelled("query", dcc.Dropdown(id="why-query-pos", clearable=False), "18em"),
    ], body=lambda chosen: [
        html.P(id="why-note", className="wb-note"),
        exports.graph("why-strip", chosen),
        html.Div(className="wb-row", children=[exports.graph("why-key", chosen),
                                               exports.graph("why-query", chosen)]),
        html.Div(className="wb-row", children=[exports.graph("why-pairs", chosen),
                                               exports.graph("why-aggregate", chosen)]),
    ])


exports.follow("why-run", page="why", graphs=GRAPHS)


def _heads(scores: pd.DataFrame) -> list[str]:
    """The run's explained heads, as the head dropdown names them, in layer order."""
    heads = scores[["layer", "head"]].drop_duplicates().sort_values(["layer", "head"])
    return [head_label(r.layer, r.head) for r in heads.itertuples()]


def _mine(scores: pd.DataFrame, head: tuple[int, int], prompt: int) -> pd.DataFrame:
    """The rows of ``scores`` of one head on one prompt.

    Raises:
        Refused: the run explains no such head, or has no such prompt.
    """
    layer, h = head
    among("head", head_label(layer, h), _heads(scores), "the run's heads")
    among("prompt", prompt, sorted(scores.prompt.unique().tolist()), "the run's prompts")
    return scores[(scores.layer == layer) & (scores["head"] == h) & (scores.prompt == prompt)]


@callback(Output("why-head", "options"), Output("why-head", "value"),
          Output("why-prompt", "options"), Output("why-prompt", "value"),
          Output("why-note", "children"), Output("why-error", "children"),
          Input("why-run", "value"), State("why-asked-head", "data"))
@safe
def choose_run(run_id: RunId, asked: Name):
    if not run_id:
        return (no_update,) * 6
    run = data.get_run(run_id, shows=SHOWS)
    scores = data.table(run, SCORES.name)
    options = _heads(scores)
    prompts = sorted(scores.prompt.unique().tolist())
    head = asked if asked in options else options[0]
    return (options, head, [{"label": f"prompt {p}", "value": p} for p in prompts],
            prompts[0], source_note(run), None)


def source_note(run: Run) -> list:
    """Where the heads came from, with a link back to the Heads page of that run."""
    sources = data.table(run, SOURCES.name).set_index("part")
    heads = sources.loc["heads"]
    parts: list = [f"heads {heads.heads} ("]
    if heads.experiment:
        parts += ["top heads of ", html.A(f"{heads.experiment} run {heads.source}",
                                          href=links.run_link(heads.source, heads.experiment),
                                          id="why-heads-link")]
    else:
        parts.append(f"{heads.source}; ")
        parts.append(html.A("Heads page", href=dash.get_relative_path("/heads"),
                            id="why-heads-link"))
    prev = sources.loc["previous"]
    parts.append(f"); previous-token heads of the K-composition group: {prev.heads or '-'} "
                 f"({prev.source}). With grouped-query attention the key side is the head's "
                 "kv group's key.")
    return parts


@callback(Output("why-query-pos", "options"), Output("why-query-pos", "value"),
          Output("why-error", "children", allow_duplicate=True),
          Input("why-run", "value"), Input("why-head", "value"), Input("why-prompt", "value"),
          prevent_initial_call="initial_duplicate")
@safe
def choose_query(run_id: RunId, head: NamedHead, prompt: Index):
    if not run_id or head is None or prompt is None:
        return no_update, no_update, no_update
    run = data.get_run(run_id, shows=SHOWS)
    mine = _mine(data.table(run, SCORES.name), head, prompt)
    tokens = _tokens(run, prompt)
    options = [{"label": f"{r.query_pos} '{tokens[r.query_pos]}' -> {r.key_pos} "
                         f"'{tokens[r.key_pos]}' (w {r.weight:.2f})", "value": int(r.query_pos)}
               for r in mine.drop_duplicates("query_pos").itertuples()]
    return options, (options[0]["value"] if options else None), no_update


def _tokens(run: Run, prompt: int) -> list[str]:
    tokens = data.table(run, TOKENS.name)
    return tokens[tokens.prompt == prompt].sort_values("position").token.tolist()


@callback(Output("why-strip", "figure"), Output("why-key", "figure"),
          Output("why-query", "figure"), Output("why-pairs", "figure"),
          Input("why-run", "value"), Input("why-head", "value"), Input("why-prompt", "value"),
          Input("why-query-pos", "value"))
@safe
def draw_pair(run_id: RunId, head: NamedHead, prompt: Index, query: Index):
    if not run_id or head is None or prompt is None or query is None:
        return (no_update,) * 4
    layer, h = head
    name = head_label(layer, h)
    run = data.get_run(run_id, shows=SHOWS)
    queries = _mine(data.table(run, SCORES.name), head, prompt)
    among("query", query, sorted(queries.query_pos.unique().tolist()),
          f"the queries of {name} on prompt {prompt}")
    tokens = _tokens(run, prompt)

    def mine(table: pd.DataFrame) -> pd.DataFrame:
        return table[(table.layer == layer) & (table["head"] == h) & (table.prompt == prompt)
                     & (table.query_pos == query)]

    pair = mine(data.table(run, SCORES.name))
    keys = pair.key_pos.tolist()
    contrib = mine(data.table(run, PAIR_CONTRIBUTIONS.name))
    title = pair_title(name, query, keys[0], tokens)
    return (strip_figure(mine(data.table(run, PATTERNS.name)), tokens, query, keys, name),
            bars_figure(contrib[contrib.side == "key"], f"key side: {title}"),
            bars_figure(contrib[contrib.side == "query"], f"query side: {title}"),
            matrix_figure(mine(data.table(run, PAIR_MATRIX.name)), f"pairs: {title}",
                          float(pair.score.mean())))


@callback(Output("why-aggregate", "figure"), Input("why-run", "value"),
          Input("why-head", "value"))
@safe
def draw_aggregate(run_id: RunId, head: NamedHead):
    if not run_id or head is None:
        return no_update
    layer, h = head
    run = data.get_run(run_id, shows=SHOWS)
    among("head", head_label(layer, h), _heads(data.table(run, SCORES.name)), "the run's heads")
    att = data.table(run, ATTRIBUTION.name)
    return aggregate_figure(att[(att.layer == layer) & (att["head"] == h)],
                            head_label(layer, h))
