"""Which page shows a run: one mapping, read from the pages' own declarations.

Each page registers itself with the experiments it shows and its nav order, read from the
one declaration of them in the library (:mod:`workbench.views.pages`, which a run's
notebook card links with too): ``dash.register_page(__name__, ...,
order=pages.order("/sinks"), experiments=pages.shows("/sinks"))``. When several pages
show one experiment (a ``record`` run opens in Recording and in Residual stream), the
first page of the nav (lowest ``order``) is the run's page. Run kinds no page declares
open in the Runs page, which shows any run's provenance and tables.

Examples:
    >>> page_for("attention-sinks")                          # doctest: +SKIP
    '/sinks'
    >>> run_link("20260101-120000-ab12", "attention-sinks")   # doctest: +SKIP
    '/sinks?run=20260101-120000-ab12'
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import dash

RUNS_PAGE = "/"
"""Where a run of a kind no page declares opens (the Runs page, with the run selected)."""


def _pages() -> list[dict[str, Any]]:
    return sorted(dash.page_registry.values(), key=lambda p: (p.get("order") or 0, p["path"]))


def pages_by_experiment() -> dict[str, list[dict[str, Any]]]:
    """Every experiment a page declares, with the pages that show it, in nav order.

    Returns:
        ``{experiment: [page registry entry, ...]}``.
    """
    shown: dict[str, list[dict[str, Any]]] = {}
    for page in _pages():
        for experiment in page.get("experiments", ()):
            shown.setdefault(experiment, []).append(page)
    return shown


def page_for(experiment: str) -> str:
    """The path of the page that shows runs of ``experiment``.

    Args:
        experiment: the run's experiment (its ``run.json`` ``experiment``).

    Returns:
        The page's path as the browser requests it (with the app's path prefix), or the
        Runs page's for a kind no page declares.
    """
    pages = pages_by_experiment().get(experiment)
    if pages:
        return pages[0]["relative_path"]
    return dash.get_relative_path(RUNS_PAGE)


def run_link(run_id: str, experiment: str) -> str:
    """The shareable address of one run on its page.

    Args:
        run_id: the run's id, as the store lists it.
        experiment: the run's experiment.

    Returns:
        ``<page path>?run=<id>``.
    """
    return f"{page_for(experiment)}?run={quote(run_id, safe='')}"
