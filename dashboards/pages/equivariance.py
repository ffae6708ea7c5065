"""Equivariance: the permutation-equivariance verdicts, a head's pattern before and after a
permutation, and the worked four-token attention example step by step.

It reads a run's ``verdicts``, ``patterns``, ``tokens`` and ``permutations`` tables by their
declarations (``experiments/permutation_equivariance/tables.py``); the worked example is
computed by :mod:`workbench.scores.attention` (a few 4 x 4 products)."""

from __future__ import annotations

import dash
import numpy as np
import pandas as pd
import torch
from dash import Input, Output, callback, dash_table, dcc, html, no_update

from dashboards.components import data, exports
from dashboards.components.controls import labelled, run_search
from dashboards.components.messages import safe, safe_layout
from dashboards.components.skeleton import run_page
from dashboards.components.values import Head, Index, Layer, Name, Refused, RunId, among
from experiments.permutation_equivariance.tables import PATTERNS, PERMUTATIONS, TOKENS, VERDICTS
from workbench.scores.attention import worked_example
from workbench.views import pages, style

EXPERIMENT = "permutation-equivariance"
SHOWS = pages.shows("/equivariance")
run_search("equivariance-run", SHOWS)
dash.register_page(__name__, path="/equivariance", name="Equivariance",
                   order=pages.order("/equivariance"), experiments=SHOWS)

EMPTY = ("No permutation-equivariance runs yet. Make one with "
         "`workbench run permutation-equivariance --model smollm2`.")
VERDICT_COLUMNS = [c for c in VERDICTS.names if c not in ("model", "n_failed", "source")]
DEFAULT_CONDITION = "no positions, no mask"


@safe_layout("Equivariance")
def layout(run: str | None = None, **_: str) -> html.Div:
    return run_page("equivariance", "Equivariance", shows=SHOWS, requested=run, empty=EMPTY,
                    controls=[], body=lambda chosen: [
        html.H3("Verdicts"),
        html.P("Each row: the largest (for equivariant / unchanged) or smallest (for not "
               "equivariant / changes) of max|f(PX) - P f(X)| / max|f(X)| over prompts, "
               "seeds and layers, against the stated tolerance.", className="wb-note"),
        dash_table.DataTable(
            id="equivariance-verdicts", page_size=30, sort_action="native",
            columns=[{"name": c, "id": c} for c in VERDICT_COLUMNS],
            tooltip_header={c: VERDICTS.column(c).meaning for c in VERDICT_COLUMNS},
            style_cell={"textAlign": "left", "fontSize": "0.8em", "whiteSpace": "normal",
                        "maxWidth": "28em"},
            style_data_conditional=[
                {"if": {"filter_query": '{verdict} = "fail"'}, "color": "#b91c1c"},
                {"if": {"filter_query": '{verdict} = "n/a"'}, "color": "#9ca3af"}]),
        html.H3("A head before and after a permutation"),
        _view_controls(),
        html.P(id="equivariance-permutation", className="wb-note"),
        html.P(id="equivariance-view-stats", className="wb-note"),
        html.Div(className="wb-row", children=[
            exports.graph("equivariance-before", chosen),
            exports.graph("equivariance-after", chosen),
            exports.graph("equivariance-back", chosen)]),
    ], after=[html.H3("Worked example: “the cat was hungry”"), worked_example_section()])


exports.follow("equivariance-run", page="equivariance",
               graphs=["equivariance-before", "equivariance-after", "equivariance-back"])


def _view_controls() -> html.Div:
    def dropdown(name: str, width: str | None = None) -> html.Div:
        return labelled(name, dcc.Dropdown(id=f"equivariance-{name.split()[-1]}",
                                           clearable=False), width)

    return html.Div(className="wb-controls", children=[
        dropdown("condition", "24em"), dropdown("prompt", "26em"),
        dropdown("permutation seed", "10em"), dropdown("layer"), dropdown("head")])


def table(run_id: str, name: str) -> pd.DataFrame:
    """A run's table, checked against its declaration on every read (data.table)."""
    return data.table(data.get_run(run_id, shows=SHOWS), name)


@callback(Output("equivariance-verdicts", "data"),
          Output("equivariance-condition", "options"), Output("equivariance-condition", "value"),
          Output("equivariance-prompt", "options"), Output("equivariance-prompt", "value"),
          Output("equivariance-seed", "options"), Output("equivariance-seed", "value"),
          Output("equivariance-layer", "options"), Output("equivariance-layer", "value"),
          Output("equivariance-head", "options"), Output("equivariance-head", "value"),
          Output("equivariance-error", "children"), Input("equivariance-run", "value"))
@safe
def choose_run(run_id: RunId):
    if run_id is None:
        return (no_update,) * 12
    verdicts = table(run_id, VERDICTS.name)
    shown = verdicts[VERDICT_COLUMNS].copy()
    for col in ("max_rel_error", "min_rel_error", "tolerance"):
        shown[col] = shown[col].map(lambda v: "" if pd.isna(v) else f"{v:.2g}")
    shown["shift"] = shown["shift"].map(lambda c: f"c = {c}" if c else "")
    patterns = table(run_id, PATTERNS.name)
    tokens = table(run_id, TOKENS.name)
    conditions = list(dict.fromkeys(patterns.condition))
    prompts = sorted(patterns.prompt.unique().tolist())
    prompt_opts = [{"label": f"{p}: {_preview(tokens[tokens.prompt == p].token.tolist())}",
                    "value": p} for p in prompts]
    seeds = _seeds(patterns)
    layers = sorted(patterns.layer.unique().tolist())
    heads = sorted(patterns["head"].unique().tolist())

    def first(values: list, preferred=None):
        return preferred if preferred in values else (values[0] if values else None)

    return (shown.to_dict("records"), conditions, first(conditions, DEFAULT_CONDITION),
            prompt_opts, first(prompts), [{"label": str(s), "value": s} for s in seeds],
            first(seeds), layers, first(layers), heads, first(heads), None)


def _seeds(patterns: pd.DataFrame) -> list[int]:
    """The permutation seeds (the original input is stored under seed -1)."""
    return sorted(s for s in patterns.seed.unique().tolist() if s >= 0)


def check_view(patterns: pd.DataFrame, condition: str, prompt: int, seed: int, layer: int,
               head: int) -> None:
    """Refuse a choice of the view the run's patterns do not hold.

    Raises:
        Refused: the message names the first value the run does not have.
    """
    among("condition", condition, list(dict.fromkeys(patterns.condition)),
          "the run's conditions")
    among("prompt", prompt, sorted(patterns.prompt.unique().tolist()), "the run's prompts")
    among("seed", seed, _seeds(patterns), "the run's permutation seeds")
    among("layer", layer, sorted(patterns.layer.unique().tolist()), "the run's layers")
    among("head", head, sorted(patterns["head"].unique().tolist()), "the run's heads")


def _preview(tokens: list[str], n: int = 12) -> str:
    # byte-pair tokens carry their own spaces; word pieces do not
    joiner = "" if any(t.startswith(" ") for t in tokens) else " "
    return joiner.join(tokens[:n]).replace("\n", " ")[:60] + "…"


def _matrix(patterns: pd.DataFrame, n: int) -> np.ndarray:
    grid = np.full((n, n), np.nan)
    grid[patterns["query"].to_numpy(), patterns["key"].to_numpy()] = patterns.weight.to_numpy()
    return grid


@callback(Output("equivariance-before", "figure"), Output("equivariance-after", "figure"),
          Output("equivariance-back", "figure"), Output("equivariance-permutation", "children"),
          Output("equivariance-view-stats", "children"),
          Input("equivariance-run", "value"), Input("equivariance-condition", "value"),
          Input("equivariance-prompt", "value"), Input("equivariance-seed", "value"),
          Input("equivariance-layer", "value"), Input("equivariance-head", "value"))
@safe
def draw(run_id: RunId, condition: Name, prompt: Index, seed: Index, layer: Layer, head: Head):
    if None in (run_id, condition, prompt, seed, layer, head):
        return (no_update,) * 5
    patterns = table(run_id, PATTERNS.name)
    check_view(patterns, condition, prompt, seed, layer, head)
    pick = patterns[(patterns.condition == condition) & (patterns.prompt == prompt)
                    & (patterns.layer == layer) & (patterns["head"] == head)]
    original, permuted = pick[pick.input == "original"], pick[pick.seed == seed]
    if original.empty or permuted.empty:
        raise Refused(f"run {run_id} holds no pattern of L{layer}H{head} under '{condition}' "
                      f"for prompt {prompt} and seed {seed}")
    tokens = table(run_id, TOKENS.name)
    toks = tokens[tokens.prompt == prompt].sort_values("position").token.tolist()
    perms = table(run_id, PERMUTATIONS.name)
    perm = perms[(perms.prompt == prompt) & (perms.seed == seed) & (perms.kind == "full")]
    perm = perm.sort_values("position").source.to_numpy()
    before, after = _matrix(original, len(toks)), _matrix(permuted, len(toks))
    inverse = np.argsort(perm)
    back = after[inverse][:, inverse]  # A'[i, j] belongs to tokens perm[i], perm[j]
    gap = float(np.nanmax(np.abs(back - before)))
    where = f"L{layer}H{head}, {condition}"
    figs = (style.pattern_heatmap(before, toks, f"{where}: X (original order)"),
            style.pattern_heatmap(after, [toks[i] for i in perm],
                                    f"{where}: PX (permuted order)"),
            style.pattern_heatmap(back, toks, f"{where}: PX permuted back"))
    order = " ".join(f"{i}" for i in perm)
    stats = (f"max |permuted back - original| = {gap:.2g}: "
             + ("the pattern moved with its tokens (equivariant)." if gap < 1e-4 else
                "the pattern did not just move with its tokens (not equivariant)."))
    return (*figs, f"permutation (seed {seed}): position i of PX holds token perm[i] of X; "
            f"perm = [{order}]", stats)


# ---- the worked example ------------------------------------------------------------------

def _table(title: str, values: torch.Tensor, rows: list[str], cols: list[str], key: str,
           note: str = "") -> html.Div:
    """One labelled matrix as an HTML table (4 decimals, integers shown as integers)."""
    def cell(v: float) -> str:
        return f"{v:.0f}" if float(v).is_integer() else f"{v:.4f}"

    pad = {"padding": "0.1em 0.55em", "textAlign": "right"}
    head = html.Tr([html.Th("")] + [html.Th(c, style=pad) for c in cols])
    body = [html.Tr([html.Th(r, style=pad)] + [html.Td(cell(v), style=pad) for v in row])
            for r, row in zip(rows, values.tolist(), strict=True)]
    return html.Div(className="wb-matrix", children=[
        html.Div(title, style={"fontWeight": 600}),
        html.Table([html.Thead(head), html.Tbody(body)], id=f"equivariance-worked-{key}",
                   style={"borderCollapse": "collapse", "fontFamily": "monospace",
                          "fontSize": "0.85em"}),
        html.Div(note, className="wb-note") if note else None,
    ], style={"marginRight": "2em", "marginBottom": "1em"})


def worked_example_section() -> html.Div:
    """X, Q, K, V, scores, weights and output of the four-token example, computed with
    :mod:`workbench.scores.attention` (a few 4 x 4 products, so it is built at request time)."""
    ex = worked_example()
    toks = list(ex.tokens)
    dims = ["d1", "d2", "d3", "d4"]
    k3 = ["1", "2", "3"]
    steps = [
        ("1. inputs", [_table("X (one row per token)", ex.x, toks, dims, "x"),
                       _table("W_Q", ex.w_q, dims, k3, "w_q"),
                       _table("W_K", ex.w_k, dims, k3, "w_k"),
                       _table("W_V", ex.w_v, dims, k3, "w_v")]),
        ("2. projections", [_table("Q = X W_Q", ex.q, toks, k3, "q"),
                            _table("K = X W_K", ex.k, toks, k3, "k"),
                            _table("V = X W_V", ex.v, toks, k3, "v")]),
        ("3. scores", [_table("S = Q Kᵀ (query rows, key columns)", ex.scores, toks, toks,
                              "scores"),
                       _table("S / √3", ex.scaled, toks, toks, "scaled")]),
        ("4. weights and output", [
            _table("A = softmax(S / √3), each row sums to 1", ex.weights, toks, toks,
                   "weights"),
            _table("O = A V", ex.output, toks, k3, "output")]),
        ("5. with a causal mask", [
            _table("A with a causal mask (0 above the diagonal)", ex.causal_weights, toks,
                   toks, "causal-weights"),
            _table("O with a causal mask", ex.causal_output, toks, k3, "causal-output",
                   "the first row is V's first row: 'the' sees only itself")]),
        ("6. shuffled input, no mask", [
            _table(f"O of P X, rows ({', '.join(ex.shuffled_tokens)})", ex.shuffled_output,
                   list(ex.shuffled_tokens), k3, "shuffled-output",
                   "the rows of O, shuffled the same way: attention is permutation "
                   "equivariant")]),
    ]
    return html.Div(id="equivariance-worked", children=[
        html.Div([html.H4(title), html.Div(children=tables,
                                           style={"display": "flex", "flexWrap": "wrap"})])
        for title, tables in steps])
