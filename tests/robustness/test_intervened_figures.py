"""Every figure a page draws from one run carries that run's interventions in its title, on
every page, so a head-masked run is never drawn as if it were clean.

The stocked store's runs are clean; the test gives every run the same interventions text
(``Run.interventions_text``, which each run's short form comes from) and posts each
figure-drawing callback of each page with the page's valid values, as a browser would.
"""

from __future__ import annotations

from typing import Any

import pytest

from dashboards.app import create_app
from tests.dashboard_runs import messages_in, post_callback
from tests.robustness.test_dashboard_inputs import BASE, KIND
from workbench.store.runs import Run

MARK = "2 heads zero-ablated (L0H1, L1H3)"
PAGES = {**{p: KIND[p] for p in BASE if p not in ("runs", "sweeps")},
         "overview": "head-overview", "distance": "induction-distance", "circuit": "circuit"}
"""Each page that draws one run's figures, and the kind of run it draws (a sweep's
figures are drawn from its cells' runs, each named in the mosaic)."""
VALID = {**BASE, "circuit": {"circuit-size.value": 1},
         "overview": {"overview-metric.value": "entropy", "overview-fdr.value": 0.05}}
"""The valid values of each page's other inputs."""


@pytest.fixture(scope="module")
def app(stocked):
    app = create_app(stocked.runs)
    assert app.server.test_client().get("/").status_code == 200  # registers the callbacks
    return app


def _figure_callbacks(app, page: str) -> list[str]:
    """The callbacks that take the page's run as an input and draw at least one figure."""
    run_input = f"{page}-run"
    return [key for key, spec in app.callback_map.items()
            if any(i["id"] == run_input for i in spec["inputs"]) and ".figure" in key]


def _titles(payload: dict[str, Any]) -> list[str]:
    """The title of every figure in a callback's response."""
    return [(value.get("layout", {}).get("title") or {}).get("text") or ""
            for outputs in payload.values() for prop, value in outputs.items()
            if prop == "figure" and isinstance(value, dict) and "data" in value]


@pytest.mark.parametrize("page", sorted(PAGES))
def test_every_figure_of_a_run_names_its_interventions(app, stocked, page, monkeypatch):
    values = {f"{page}-run.value": stocked.kinds[PAGES[page]], **VALID.get(page, {})}
    keys = _figure_callbacks(app, page)
    assert keys, f"the {page} page has no figure callback on its run"
    drawn = {}
    for marked in (False, True):
        if marked:
            monkeypatch.setattr(Run, "interventions_text", property(lambda run: MARK))
        titles = []
        for key in keys:
            status, text, payload = post_callback(app, key, values)
            assert status in (200, 204), text[:300]
            assert messages_in(payload) == [], (key, messages_in(payload))
            titles += _titles(payload)
        drawn[marked] = titles
    assert drawn[True], f"the {page} page drew no figure"
    assert len(drawn[True]) == len(drawn[False])
    assert not any(MARK in t for t in drawn[False])  # the control: a clean run's titles
    unmarked = [t for t in drawn[True] if not t.replace("<br>", " ").endswith(MARK)]
    assert unmarked == [], f"{page}: figures without the run's interventions: {unmarked}"
