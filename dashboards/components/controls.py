"""Labelled controls with ids prefixed by their page."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import numpy as np
from dash import Input, Output, State, callback, dcc, html, no_update

from dashboards.components import data, messages
from dashboards.components.messages import message, one_line
from dashboards.components.values import Name, RunId, below
from workbench.core.errors import WorkbenchError
from workbench.harness import run_facts
from workbench.recording.reader import Recording
from workbench.store.runs import Run
from workbench.views.style import COLOUR_SCALES


def labelled(label: str, control: Any, width: str | None = None) -> html.Div:
    style = {"minWidth": width} if width else None
    return html.Div([html.Label(label), control], className="wb-control", style=style)


def colour_scale(page: str, value: str = "linear") -> html.Div:
    """The colour-scale switch of a page's pattern heatmaps (``<page>-scale``): linear,
    log or power (:func:`workbench.views.style.colour_stops`)."""
    return labelled("colour scale", dcc.RadioItems(id=f"{page}-scale", value=value,
                                                   inline=True, options=list(COLOUR_SCALES)))


@lru_cache(maxsize=32)  # a recording opened once is one object (data.recording caches it)
def strongest_sink(rec: Recording, prompt: int) -> tuple[int, int]:
    """The ``(layer, head)`` with the largest mean weight on the first key over the
    prompt's queries (:meth:`Recording.first_key_mass`): the head a recording's page opens
    on, the attention sink, whose spread beyond the first key the log scale shows. The
    first of equals."""
    mass = np.stack([rec.first_key_mass(prompt, layer) for layer in range(rec.n_layers)])
    layer, head = np.unravel_index(int(np.argmax(mass)), mass.shape)
    return int(layer), int(head)


def run_label(run: Run) -> str:
    """A run as a dropdown lists it: experiment, model (a sweep's spec name), the config
    values it changed from the defaults, when it started and its id's last four."""
    started = run.started_at[:16].replace("T", " ")
    name = run_facts.sweep_name(run) or run.model_name or "-"
    changed = run_facts.varies_text(run)
    changed = "" if changed == "-" else f" · {changed}"
    return f"{run.experiment} · {name}{changed} · {started} · {run.id[-4:]}"


MAX_RUN_CHOICES = 10
"""A run dropdown opens offering at most this many runs: the newest, and the one shown.
Typing into it searches every run the page shows (:func:`run_search`), so a store of
10,000 runs neither sends 10,000 options with every page nor hides one: a browser indexes
every option a dropdown is given for its own filtering, at a cost that grows with the
options."""
SEARCH_CHOICES = 50
"""A search of a run dropdown offers at most this many matches, newest first."""


def _option(run: Run) -> dict[str, Any]:
    return {"label": run_label(run), "value": run.id}


def run_options(runs: Sequence[Run], shown: str | None = None) -> list[dict[str, Any]]:
    """The options a run dropdown opens with: the newest :data:`MAX_RUN_CHOICES` of
    ``runs`` (newest first) and run ``shown`` if it is older, then a note of how many more
    a search finds."""
    offered = list(runs[:MAX_RUN_CHOICES])
    older = [r for r in runs[MAX_RUN_CHOICES:] if r.id == shown]
    options = [_option(r) for r in [*offered, *older]]
    if len(runs) > len(offered) + len(older):
        left = len(runs) - len(offered) - len(older)
        options.append({"label": f"type to search {left} older runs", "value": "",
                        "disabled": True})
    return options


def matching_options(runs: Sequence[Run], typed: str, shown: str | None = None
                     ) -> list[dict[str, Any]]:
    """The options of a run dropdown while ``typed`` is typed into it: the newest
    :data:`SEARCH_CHOICES` of ``runs`` whose label or id holds ``typed`` (ignoring case;
    the browser filters the options by the same text), and run ``shown`` (a dropdown keeps
    the option of its value, or shows it empty)."""
    needle = typed.strip().lower()
    found, shown_option = [], None
    for run in runs:
        option = None
        if len(found) < SEARCH_CHOICES:
            option = _option(run)
            if needle in option["label"].lower() or needle in run.id.lower():
                found.append(option)
                continue
        if run.id == shown:
            shown_option = option or _option(run)
    return found if shown_option is None else [*found, shown_option]


def run_search(component_id: str, shows: Sequence[str]) -> None:
    """Let run dropdown ``component_id`` search every complete run of the experiments
    ``shows``: what is typed fills its options with the matches
    (:func:`matching_options`); emptied, it offers the newest again (:func:`run_options`).
    Called once by each page that has such a dropdown, beside its layout."""
    kinds = tuple(shows)

    page = component_id.rsplit("-", 1)[0]

    @callback(Output(component_id, "options"),
              Output(f"{page}-error", "children", allow_duplicate=True),
              Input(component_id, "search_value"), State(component_id, "value"),
              prevent_initial_call=True)
    @messages.safe
    def search(typed: Name, shown: RunId) -> tuple[list[dict[str, Any]], Any]:
        runs = [run for run in data.runs() if run.experiment in kinds]
        if not typed:
            return run_options(runs, shown), no_update
        return matching_options(runs, typed, shown), no_update


def run_dropdown(component_id: str, runs: Sequence[Run], value: str | None) -> dcc.Dropdown:
    if value is None and runs:
        value = runs[0].id
    return dcc.Dropdown(id=component_id, options=run_options(runs, value), value=value,
                        clearable=False, placeholder="no runs yet")


def prompt_options(tokens_by_prompt: list[list[str]], labels: list[str]) -> list[dict]:
    opts = []
    for i, (toks, label) in enumerate(zip(tokens_by_prompt, labels, strict=True)):
        preview = "".join(toks[:12]).replace("\n", " ")
        opts.append({"label": f"{i}: {label} ({len(toks)} tok) {preview}…", "value": i})
    return opts


def recording_choices(run_id: str | None) -> tuple[list[dict], list[int], list[int]]:
    """The prompt, layer and head options of the recording of run ``run_id`` (all empty
    without a run).

    Raises:
        WorkbenchError: the run is not a readable complete recording.
    """
    if run_id is None:
        return [], [], []
    rec = data.recording(run_id)
    prompts = prompt_options([p.tokens for p in rec.prompts], [p.label for p in rec.prompts])
    return prompts, list(range(rec.n_layers)), list(range(rec.n_heads))


def opening_head(run_id: str | None) -> tuple[int, int]:
    """The layer and head a recording page opens on: the strongest sink of the run's first
    prompt (:func:`strongest_sink`); ``(0, 0)`` without a readable recording."""
    if run_id is None:
        return 0, 0
    try:
        return strongest_sink(data.recording(run_id), 0)
    except (WorkbenchError, OSError):  # the page says why (recording_layout_choices)
        return 0, 0


def last_query(run_id: str | None, prompt: int = 0) -> int:
    """The last query position of a recording's prompt, which attends over the whole
    prompt (0 without a readable recording)."""
    if run_id is None:
        return 0
    try:
        return data.recording(run_id).length(prompt) - 1
    except (WorkbenchError, OSError):
        return 0


def recording_layout_choices(run_id: str | None
                             ) -> tuple[list[dict], list[int], list[int], Any]:
    """:func:`recording_choices` for a page's layout, and the message saying why they are
    empty when the run cannot be read (``None`` when it can).

    The layout fills the dropdowns with their options and values together: a Dash
    dropdown drops a value that is not among its options, so options filled in later by a
    callback race the first render and can leave the layer or head blank. A run that
    cannot be read leaves the run list, to pick another.
    """
    try:
        return *recording_choices(run_id), None
    except (WorkbenchError, OSError) as exc:
        return [], [], [], message(one_line(exc))


def check_choice(rec: Recording, prompt: int | None, layer: int | None,
                 head: int | None) -> None:
    """Refuse a prompt, layer or head the recording does not have (``None``: not chosen).

    Raises:
        Refused: the message names the first one beyond the recording.
    """
    for label, value, count, what in (("prompt", prompt, len(rec), "prompts in the recording"),
                                      ("layer", layer, rec.n_layers, "layers in the recording"),
                                      ("head", head, rec.n_heads, "heads in each layer")):
        if value is not None:
            below(label, value, count, what)
