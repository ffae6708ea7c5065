"""Which dashboard page shows which run kinds, and its place in the nav (one position a
page): declared once, here, where the library can read it too (a run's notebook card links
to its page). Each page of ``dashboards/pages/`` registers itself with
``experiments=pages.shows(<its path>)`` and ``order=pages.order(<its path>)``, and the Runs
page's links (``dashboards/components/links.py``) read them back from Dash's page registry,
so the two cannot drift apart.

When several pages show one kind (a ``record`` run opens in Recording, Residual stream,
Long context and Live), the first page of the nav (lowest ``order``, then path) is the
run's page; a kind no page declares opens in the Runs page.

Examples:
    >>> shows("/heads")
    ['previous-token-heads', 'induction-heads']
    >>> page_for("record")
    '/recording'
    >>> run_link("http://127.0.0.1:8050", "20260101-120000-ab12", "attention-sinks")
    'http://127.0.0.1:8050/sinks?run=20260101-120000-ab12'
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote

from workbench.core.errors import UnknownNameError


@dataclass(frozen=True)
class Page:
    """A dashboard page: its path, its nav position and the run kinds it shows."""

    path: str
    order: int
    experiments: tuple[str, ...]


PAGES: tuple[Page, ...] = (
    Page("/", 0, ("reproduce",)),
    Page("/recording", 1, ("record",)),
    Page("/residual", 2, ("record",)),
    Page("/heads", 3, ("previous-token-heads", "induction-heads")),
    Page("/sinks", 4, ("attention-sinks",)),
    Page("/overview", 5, ("head-overview",)),
    Page("/pruning", 6, ("head-pruning",)),
    Page("/formation", 7, ("induction-formation",)),
    Page("/long-context", 8, ("record",)),
    Page("/why", 9, ("qk-attribution",)),
    Page("/equivariance", 10, ("permutation-equivariance",)),
    Page("/sweeps", 11, ("sweep",)),
    Page("/patching", 12, ("ioi",)),
    Page("/lens", 13, ("logit-lens",)),
    Page("/distance", 14, ("induction-distance",)),
    Page("/circuit", 15, ("circuit",)),
    Page("/compare", 16, ()),  # two runs of any kind below: compared(), never a run's page
    Page("/live", 20, ("record",)),
)
RUNS_PAGE = "/"
"""Where a run of a kind no page declares opens (the Runs page, with the run selected)."""


def _page(path: str) -> Page:
    for page in PAGES:
        if page.path == path:
            return page
    raise UnknownNameError(f"no dashboard page at '{path}'; pages: "
                           f"{', '.join(p.path for p in PAGES)}")


def shows(path: str) -> list[str]:
    """The run kinds the page at ``path`` shows.

    Raises:
        UnknownNameError: no page has that path (the message lists the paths).
    """
    return list(_page(path).experiments)


def order(path: str) -> int:
    """The nav position of the page at ``path`` (as :func:`shows`)."""
    return _page(path).order


NOT_COMPARED = ("record", "reproduce", "sweep")
"""Run kinds the Compare page does not offer: a recording, a claims check and a sweep hold
no experiment's tables to pair."""


def compared() -> list[str]:
    """The run kinds the Compare page offers: every experiment another page shows, in nav
    order."""
    kinds = [e for page in sorted(PAGES, key=lambda p: (p.order, p.path))
             for e in page.experiments if e not in NOT_COMPARED]
    return list(dict.fromkeys(kinds))


def page_for(experiment: str) -> str:
    """The path of the page a run of ``experiment`` opens on."""
    for page in sorted(PAGES, key=lambda p: (p.order, p.path)):
        if experiment in page.experiments:
            return page.path
    return RUNS_PAGE


def run_link(base_url: str, run_id: str, experiment: str) -> str:
    """The address of one run on its page of the dashboard served at ``base_url``."""
    return f"{base_url.rstrip('/')}{page_for(experiment)}?run={quote(run_id, safe='')}"
