"""Patching: activation patching of an ioi run, layers x positions and layers x heads.

Pick a run, a group of prompts (one template in one order: every prompt of it has the same
tokens at the same positions) and a site: the first heatmap is the normalised metric (0 the
corrupted run, 1 the clean one) of each layer's site patched at one position, the positions
labelled with the group's tokens and the named positions (IO, S1, S1+1, S2, END); the second
is each head's output patched at every position, over every patched prompt. Clicking a cell
shows its value with its 95% bootstrap interval over prompts. Under them, the class
diagram (:mod:`workbench.views.circuit`): the heads of each of Wang et al.'s classes
in groups, previous-token -> induction and duplicate-token -> S-inhibition -> name movers
and negative name movers -> logits, each arrow a stored direct effect or path patch, its
width the effect, its label's hover the interval; a class with no head is an empty group.
Everything is read from the run's tables by the names ``experiments/ioi/tables.py``
declares.
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
from dashboards.components.values import Click, Name, RunId, among, below, cell_of, triggered
from experiments.ioi.tables import (
    BEHAVIOUR,
    CLASSES,
    PATCH_HEADS,
    PATCH_POSITIONS,
    PATH_PATCHING,
    UPSTREAM_PATHS,
)
from workbench.store.runs import Run
from workbench.views import circuit, pages
from workbench.views.patching import heads_figure, position_label, positions_figure

SHOWS = pages.shows("/patching")
run_search("patching-run", SHOWS)
dash.register_page(__name__, path="/patching", name="Patching",
                   order=pages.order("/patching"), experiments=SHOWS)

EMPTY = "No ioi runs yet. Make one with `workbench run ioi --model smollm2`."
GRAPHS = ["patching-positions", "patching-heads", "patching-circuit"]
ClickedCell = Annotated[tuple[int, int] | None,
                        Click(cell_of, "a click on a cell of a layers x positions grid")]
ClickedHead = Annotated[tuple[int, int] | None,
                        Click(cell_of, "a click on a cell of a layer x head grid")]


@safe_layout("Patching")
def layout(run: str | None = None, **_: str) -> html.Div:
    return run_page("patching", "Activation patching", shows=SHOWS, requested=run,
                    empty=EMPTY, controls=[
        labelled("group", dcc.Dropdown(id="patching-group", clearable=False), "12em"),
        labelled("site", dcc.Dropdown(id="patching-site", clearable=False), "10em"),
    ], body=lambda chosen: [
        html.P(id="patching-note", className="wb-note"),
        html.P(id="patching-cell", className="wb-note"),
        exports.graph("patching-positions", chosen),
        exports.graph("patching-heads", chosen),
        exports.graph("patching-circuit", chosen),
    ])


exports.follow("patching-run", page="patching", graphs=GRAPHS)


def behaviour_note(run: Run) -> str:
    row = data.table(run, BEHAVIOUR.name).set_index("scope").loc["all"]
    verdict = ("above chance" if row.above_chance else
               "not above chance: no head class is claimed")
    return (f"logit difference IO - S at END {row.logit_diff:+.3f} [{row.ci_low:+.3f}, "
            f"{row.ci_high:+.3f}] over {int(row.n_prompts)} prompts ({verdict}). Normalised "
            "metric: 0 is the corrupted (ABC) run, 1 the clean one.")


@callback(Output("patching-group", "options"), Output("patching-group", "value"),
          Output("patching-site", "options"), Output("patching-site", "value"),
          Output("patching-note", "children"), Output("patching-error", "children"),
          Input("patching-run", "value"))
@safe
def choose_run(run_id: RunId):
    if not run_id:
        return (no_update,) * 6
    run = data.get_run(run_id, shows=SHOWS)
    table = data.table(run, PATCH_POSITIONS.name)
    groups = sorted(table.group.unique().tolist())
    sites = list(dict.fromkeys(table.site.tolist()))
    return (groups, groups[0] if groups else None, sites, sites[0] if sites else None,
            behaviour_note(run), None)


def _rows(run: Run, group: str, site: str) -> pd.DataFrame:
    """The run's patch_positions rows of one group and site.

    Raises:
        Refused: the run has no such group or site.
    """
    table = data.table(run, PATCH_POSITIONS.name)
    among("group", group, sorted(table.group.unique().tolist()), "the run's groups")
    among("site", site, list(dict.fromkeys(table.site.tolist())), "the run's sites")
    return table[(table.group == group) & (table.site == site)]


@callback(Output("patching-positions", "figure"), Input("patching-run", "value"),
          Input("patching-group", "value"), Input("patching-site", "value"))
@safe
def draw_positions(run_id: RunId, group: Name, site: Name):
    if not run_id or group is None or site is None:
        return no_update
    rows = _rows(data.get_run(run_id, shows=SHOWS), group, site)
    return positions_figure(rows, f"{site} patched at one position, {group}")


@callback(Output("patching-heads", "figure"), Input("patching-run", "value"))
@safe
def draw_heads(run_id: RunId):
    if not run_id:
        return no_update
    heads = data.table(data.get_run(run_id, shows=SHOWS), PATCH_HEADS.name)
    return heads_figure(heads)


@callback(Output("patching-cell", "children"), Input("patching-run", "value"),
          Input("patching-group", "value"), Input("patching-site", "value"),
          Input("patching-positions", "clickData"), Input("patching-heads", "clickData"),
          prevent_initial_call=True)
@safe
def show_cell(run_id: RunId, group: Name, site: Name, cell: ClickedCell, head: ClickedHead):
    if not run_id or group is None or site is None:
        return no_update
    run = data.get_run(run_id, shows=SHOWS)
    if triggered() == "patching-heads" and head is not None:
        heads = data.table(run, PATCH_HEADS.name)
        layer, h = head
        below("layer", layer, int(heads.layer.max()) + 1, "layers patched")
        below("head", h, int(heads["head"].max()) + 1, "heads in each layer")
        row = heads[(heads.layer == layer) & (heads["head"] == h)].iloc[0]
        return (f"L{layer}H{h}'s output patched at every position: {row.value:.3f} "
                f"[{row.ci_low:.3f}, {row.ci_high:.3f}] over {int(row.n_prompts)} prompts")
    if triggered() == "patching-positions" and cell is not None:
        rows = _rows(run, group, site)
        layer, position = cell
        below("layer", layer, int(rows.layer.max()) + 1, "layers patched")
        below("position", position, int(rows.position.max()) + 1, "positions in the group")
        row = rows[(rows.layer == layer) & (rows.position == position)].iloc[0]
        return (f"{site} of layer {layer} patched at position {position_label(row)}: "
                f"{row.value:.3f} [{row.ci_low:.3f}, {row.ci_high:.3f}] over "
                f"{int(row.n_prompts)} prompts of {group}")
    return "Click a cell to see its value with its 95% bootstrap interval over prompts."


@callback(Output("patching-circuit", "figure"), Input("patching-run", "value"))
@safe
def draw_circuit(run_id: RunId):
    if not run_id:
        return no_update
    run = data.get_run(run_id, shows=SHOWS)
    # a run written before the upstream path patches has no upstream_paths table
    upstream = (data.table(run, UPSTREAM_PATHS.name) if UPSTREAM_PATHS.name in run.table_names()
                else None)
    return circuit.circuit_figure(data.table(run, CLASSES.name),
                                  data.table(run, PATH_PATCHING.name), upstream)
