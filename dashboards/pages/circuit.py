"""Circuit: which edges between heads and MLPs carry a task (a circuit run).

Pick a run and a circuit size: the size slider steps along the run's faithfulness curve
(each step a size the run evaluated, labelled with its edges and faithfulness), the curve
marks the chosen size, the graph draws that circuit (heads by layer and head, each layer's
MLP at the right, edges coloured by the sign of their score and drawn wider the larger it
is), and the node table lists the circuit's nodes by their summed ``|score|``, each head
with links to the Heads, Why and Patching pages of the newest runs of the same model.
Everything is read from the run's tables by the names ``experiments/circuit/tables.py``
declares.
"""

from __future__ import annotations

import dash
import pandas as pd
from dash import Input, Output, callback, dcc, html, no_update

from dashboards.components import data, exports, links
from dashboards.components.controls import labelled, run_search
from dashboards.components.messages import safe, safe_layout
from dashboards.components.skeleton import run_page
from dashboards.components.values import Index, RunId
from experiments.circuit.tables import EDGES, FAITHFULNESS, NODES, SCORES
from workbench.store.runs import Run
from workbench.views import pages
from workbench.views.circuit_graph import (
    circuit_edges,
    faithfulness_figure,
    graph_figure,
    node_of,
)

SHOWS = pages.shows("/circuit")
run_search("circuit-run", SHOWS)
dash.register_page(__name__, path="/circuit", name="Circuit",
                   order=pages.order("/circuit"), experiments=SHOWS)

EMPTY = ("No circuit runs yet. Make one with `workbench run circuit --model smollm2 "
         "--set task=ioi`.")
GRAPHS = ["circuit-curve", "circuit-graph"]
LEVEL = 0.8
"""The faithfulness the page opens on where the run does not say its own ``level``: the
smallest circuit whose curve reaches it."""
NODE_ROWS = 40
"""Nodes the table lists at most (the strongest)."""
HEAD_PAGES = ("/heads", "/why", "/patching")


@safe_layout("Circuit")
def layout(run: str | None = None, **_: str) -> html.Div:
    return run_page("circuit", "Circuit", shows=SHOWS, requested=run, empty=EMPTY,
                    controls=[], body=lambda chosen: [
        html.P(id="circuit-note", className="wb-note"),
        html.Div(style={"maxWidth": "60em"}, children=[
            labelled("circuit size", dcc.Slider(id="circuit-size", min=0, max=1, step=1,
                                                value=0, marks={},
                                                allow_direct_input=False), "60em")]),
        exports.graph("circuit-curve", chosen),
        exports.graph("circuit-graph", chosen),
        html.H3("The circuit's nodes"),
        html.Div(id="circuit-nodes"),
    ])


exports.follow("circuit-run", page="circuit", graphs=GRAPHS)


def opening_size(curve: pd.DataFrame, level: float = LEVEL) -> int:
    """The index (in ``fraction`` order) of the smallest circuit whose faithfulness
    reaches ``level``; the largest circuit where none does."""
    curve = curve.sort_values("fraction").reset_index(drop=True)
    reached = curve.index[curve.faithfulness >= level]
    return int(reached[0]) if len(reached) else len(curve) - 1


def _marks(curve: pd.DataFrame) -> dict[int, str]:
    return {i: f"{row.fraction:.1%}" for i, row in enumerate(curve.itertuples())}


def level_of(run: Run) -> float:
    """The faithfulness the run's summary names its smallest circuit at."""
    level = run.config.get("level", LEVEL)
    return float(level) if isinstance(level, int | float) else LEVEL


def summary(curve: pd.DataFrame, scores: pd.DataFrame, level: float = LEVEL) -> str:
    """CPR, CMD, the rank correlation with exact patching and the smallest circuit that
    reaches ``level``, in words."""
    value = scores.set_index("name").value
    at = curve.sort_values("fraction").iloc[opening_size(curve, level)]
    reached = at.faithfulness >= level
    size = (f"The smallest circuit reaching {level:.0%} faithfulness has {int(at.n_edges)} "
            f"edges ({at.fraction:.1%}): {at.faithfulness:.2f} [{at.ci_low:.2f}, "
            f"{at.ci_high:.2f}]." if reached else
            f"No circuit reaches {level:.0%} faithfulness; the largest gives "
            f"{at.faithfulness:.2f}.")
    rho = value.get("spearman_exact")
    exact = "" if rho is None or pd.isna(rho) else (
        f" Spearman's rho of the top edges' scores with exact edge patching: {rho:.2f}.")
    return (f"{size} CPR {value['cpr']:.3f} (area under the curve, higher is better), "
            f"CMD {value['cmd']:.3f} (area between it and 1, 0 is best).{exact}")


@callback(Output("circuit-size", "max"), Output("circuit-size", "marks"),
          Output("circuit-size", "value"), Output("circuit-note", "children"),
          Output("circuit-error", "children"), Input("circuit-run", "value"))
@safe
def choose_run(run_id: RunId):
    if not run_id:
        return (no_update,) * 5
    run = data.get_run(run_id, shows=SHOWS)
    curve = data.table(run, FAITHFULNESS.name).sort_values("fraction").reset_index(drop=True)
    level = level_of(run)
    return (len(curve) - 1, _marks(curve), opening_size(curve, level),
            summary(curve, data.table(run, SCORES.name), level), None)


def _shape(run: Run) -> tuple[int, int, int]:
    model = run.meta.model
    if model is None:
        raise dash.exceptions.PreventUpdate
    return model.n_layers, model.n_heads, model.n_kv_heads or model.n_heads


@callback(Output("circuit-curve", "figure"), Output("circuit-graph", "figure"),
          Output("circuit-nodes", "children"), Input("circuit-run", "value"),
          Input("circuit-size", "value"))
@safe
def draw(run_id: RunId, size: Index):
    if not run_id or size is None:
        return no_update, no_update, no_update
    run = data.get_run(run_id, shows=SHOWS)
    curve = data.table(run, FAITHFULNESS.name).sort_values("fraction").reset_index(drop=True)
    at = curve.iloc[min(size, len(curve) - 1)]
    edges, nodes = data.table(run, EDGES.name), data.table(run, NODES.name)
    n_layers, n_heads, n_kv = _shape(run)
    graph = graph_figure(edges, nodes, n_edges=int(at.n_edges), n_layers=n_layers,
                         n_heads=n_heads, n_kv_heads=n_kv)
    return (faithfulness_figure(curve, selected=float(at.fraction)), graph,
            node_table(run, edges, nodes, int(at.n_edges)))


def node_table(run: Run, edges: pd.DataFrame, nodes: pd.DataFrame, n_edges: int) -> html.Table:
    """The circuit's nodes, strongest first, each head with links to its other pages."""
    circuit = circuit_edges(edges, n_edges)
    used = set(circuit.sender) | {node_of(r) for r in circuit.receiver}
    rows = nodes[nodes.node.isin(used)].sort_values("abs_out", ascending=False)
    others = _newest_of_model(run)
    head = ["node", "kind", "layer", "layer type", "out", "in", "pages"]
    body = [html.Tr([html.Td(str(r.node)), html.Td(str(r.kind)), html.Td(str(r.layer)),
                     html.Td(str(r.layer_type)), html.Td(f"{r.score_out:.4g}"),
                     html.Td(f"{r.score_in:.4g}"), html.Td(_head_links(r, others))])
            for r in rows.head(NODE_ROWS).itertuples()]
    note = ([] if len(rows) <= NODE_ROWS else
            [html.Caption(f"the strongest {NODE_ROWS} of the circuit's {len(rows)} nodes")])
    return html.Table(className="wb-table", id="circuit-node-table", children=[
        *note, html.Thead(html.Tr([html.Th(h) for h in head])), html.Tbody(body)])


def _newest_of_model(run: Run) -> dict[str, Run]:
    """The newest complete run each head page shows, of the circuit run's model."""
    model = run.model_name
    found: dict[str, Run] = {}
    for other in data.runs():
        for path in HEAD_PAGES:
            if path not in found and other.model_name == model and \
                    other.experiment in pages.shows(path):
                found[path] = other
    return found


def _head_links(row, others: dict[str, Run]) -> list:
    """Links to the Heads, Why and Patching pages for a head (none for another node)."""
    if row.kind != "head":
        return []
    parts: list = []
    for path, name in zip(HEAD_PAGES, ("Heads", "Why", "Patching"), strict=True):
        other = others.get(path)
        if other is None:
            parts.append(html.Span(name, className="wb-muted",
                                   title=f"no run of {run_kinds(path)} on this model yet"))
        else:
            href = links.run_link(other.id, other.experiment)
            if path == "/why":
                href += f"&head={row.node}"
            parts.append(html.A(name, href=href))
        parts.append(" ")
    return parts


def run_kinds(path: str) -> str:
    return " or ".join(pages.shows(path))
