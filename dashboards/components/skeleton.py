"""The layout every page that shows one run shares, written once.

A run page has a heading; when the store has no run of its kinds (and none was asked for),
a note saying how to make one; otherwise the run it opens on (``?run=``, checked, else the
newest), an error box (``<prefix>-error``), a row of controls led by the run dropdown
(``<prefix>-run``), the page's own body, and the download of its tables
(``<prefix>-download-*``). Pages pass their controls and body; ids keep the page's prefix.

Examples:
    >>> run_page("overview", "Overview", shows=["head-overview"], requested=None,
    ...          empty="No runs yet.", controls=[], body=lambda chosen: [])  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from dash import html

from dashboards.components import data, exports
from dashboards.components.controls import labelled, run_dropdown
from workbench.store.runs import Run

Parts = Sequence[Any] | Callable[[str], Sequence[Any]]
"""Components, or a function of the chosen run's id that makes them."""


def runs_of(shows: Sequence[str]) -> list[Run]:
    """The complete runs of the experiments ``shows``, newest first (one listing of the
    store, whatever the number of experiments)."""
    return [run for run in data.runs() if run.experiment in shows]


def run_page(prefix: str, title: str, *, shows: Sequence[str], requested: str | None,
             empty: str, controls: Parts, body: Parts, runs: Sequence[Run] | None = None,
             run_label: str = "run", problem: Any = None, notices: Sequence[Any] = (),
             after: Sequence[Any] = ()) -> html.Div:
    """A run page's layout.

    Args:
        prefix: the page's id prefix.
        title: its heading.
        shows: the experiments whose runs it shows.
        requested: the ``?run=`` asked for (``None``: the newest).
        empty: the note shown when there is no run to show.
        controls: the controls after the run dropdown.
        body: what follows the controls.
        runs: the runs to choose from (default: every complete run of ``shows``).
        run_label: the run dropdown's label.
        problem: what the error box says at first (``None``: nothing), or a function of
            the chosen run's id that says it.
        notices: shown under the heading, before the error box.
        after: shown last, with or without a run.

    Raises:
        WorkbenchError: ``requested`` is not a complete run the page shows (the page's
            ``safe_layout`` turns it into a message).
    """
    runs = runs_of(shows) if runs is None else list(runs)
    heading = html.H2(title)
    if not runs and requested is None:  # a requested run is checked, and refused, below
        return html.Div([heading, html.P(empty, className="wb-note"), *after])
    chosen = data.choose(requested, runs, shows=shows)
    return html.Div([
        heading, *notices,
        html.Div(problem(chosen) if callable(problem) else problem, id=f"{prefix}-error"),
        html.Div(className="wb-controls", children=[
            labelled(run_label, run_dropdown(f"{prefix}-run", runs, chosen), "34em"),
            *_made(controls, chosen)]),
        *_made(body, chosen), exports.table_download(prefix), *after,
    ])


def _made(parts: Parts, chosen: str) -> Sequence[Any]:
    return parts(chosen) if callable(parts) else parts
