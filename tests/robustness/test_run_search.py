"""A run dropdown opens on the newest runs and searches every run the page shows: what is
typed into it is answered by the server, so a run older than the first options is still
found by its label or id, and the run shown keeps its option."""

from __future__ import annotations

from typing import Any

import pytest

from dashboards.app import create_app
from dashboards.components import controls
from tests.dashboard_runs import callback_key, post_callback
from tests.tiny import fake_info
from workbench.store.runs import RunStore
from workbench.views.pages import PAGES

N_RUNS = controls.MAX_RUN_CHOICES + 4


@pytest.fixture(scope="module")
def stored(tmp_path_factory) -> tuple[Any, list[str]]:
    """A store of ``N_RUNS`` complete previous-token-heads runs (shown by /heads) beside
    one run of another kind, and the heads runs' ids newest first."""
    root = tmp_path_factory.mktemp("run-search")
    store = RunStore(root)
    for i in range(N_RUNS):
        with store.start("previous-token-heads", fake_info(f"model-{i:02d}"), {"n": i}):
            pass
    with store.start("attention-sinks", fake_info("model-sink"), {}):
        pass
    newest = [r.id for r in reversed(store.runs(experiment="previous-token-heads"))]
    app = create_app(root)
    assert app.server.test_client().get("/").status_code == 200  # registers the callbacks
    return app, newest


def search(app, component: str, typed: str | None, shown: str | None) -> list[dict]:
    status, text, response = post_callback(app, callback_key(app, f"{component}.options"),
                                           {f"{component}.search_value": typed,
                                            f"{component}.value": shown})
    assert status == 200, text
    return response[component]["options"]  # the page's error banner is left as it is


def test_every_run_page_searches_its_run_dropdown(stored):
    app, _ = stored
    for page in PAGES:
        if page.path not in ("/", "/live"):  # the Runs page lists every run; Live makes one
            callback_key(app, f"{page.path.strip('/')}-run.options")
    callback_key(app, "heads-compare.options")


def test_typing_finds_a_run_older_than_the_first_options(stored):
    app, newest = stored
    oldest = newest[-1]
    opened = search(app, "heads-run", "", newest[0])
    assert oldest not in [o["value"] for o in opened]
    assert opened[-1] == {"label": "type to search 4 older runs", "value": "",
                          "disabled": True}
    found = search(app, "heads-run", "MODEL-00", newest[0])  # its model, in any case
    assert [o["value"] for o in found] == [oldest, newest[0]]  # the shown run kept, last
    assert search(app, "heads-run", oldest[-4:], oldest) == [
        o for o in found if o["value"] == oldest]  # by its id; shown and found once


def test_a_search_offers_only_the_kinds_the_page_shows(stored):
    app, _ = stored
    assert search(app, "heads-compare", "model-sink", None) == []
    sinks = search(app, "sinks-run", "model", None)
    assert [o["label"].split(" · ")[:2] for o in sinks] == [["attention-sinks", "model-sink"]]


def test_a_search_answers_at_most_search_choices_newest_first(stored, monkeypatch):
    app, newest = stored
    monkeypatch.setattr(controls, "SEARCH_CHOICES", 3)
    assert [o["value"] for o in search(app, "heads-run", "model", None)] == newest[:3]
