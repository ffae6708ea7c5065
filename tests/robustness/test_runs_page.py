"""The Runs page pages and sorts on the server: a store's runs are listed from its index,
only one page of rows is sent, ``?run=`` opens on the page that holds the run, and each
run on the page is read again from its own ``run.json``."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pandas as pd
import pytest
from dash._utils import split_callback_id

from dashboards.app import create_app
from tests.tiny import fake_info
from workbench.store.runs import RunStore
from workbench.store.schema import Table, columns, tables

PAGE_SIZE = 20  # dashboards.pages.runs.PAGE_SIZE (its module registers a page on import)
ONE = Table("t", "one integer column", columns(("a", "int", "a number")))
N_RUNS = 2 * PAGE_SIZE + 5


@dataclass(frozen=True)
class Cfg:
    n: int = 3


@pytest.fixture(scope="module")
def stored(tmp_path_factory) -> tuple[Any, list[str]]:
    """A store of ``N_RUNS`` complete runs, and their ids newest first (as the page lists
    them)."""
    root = tmp_path_factory.mktemp("runs-page")
    store = RunStore(root)
    for i in range(N_RUNS):
        with store.start("exp", fake_info(), Cfg(n=i), tables=tables(ONE)) as run:
            run.save_table("t", pd.DataFrame({"a": [i]}))
    newest = [r.id for r in reversed(store.runs())]
    app = create_app(root)
    assert app.server.test_client().get("/").status_code == 200  # registers the callbacks
    return app, newest


def table(app, changed: str | None, **values: Any) -> dict:
    """The table callback's response, as the browser asks for it: ``values`` by
    ``id.property`` with dots as double underscores, ``changed`` the input that fired
    (``None``: the page's first call)."""
    key = next(k for k in app.callback_map if "runs-table.data" in k)
    spec = app.callback_map[key]
    given = {k.replace("__", "."): v for k, v in values.items()}

    def entry(item: dict) -> dict:
        return {**item, "value": given.get(f"{item['id']}.{item['property']}")}

    body = {"output": key, "outputs": split_callback_id(key),
            "inputs": [entry(i) for i in spec["inputs"]],
            "state": [entry(s) for s in spec["state"]],
            "changedPropIds": [changed] if changed else []}
    response = app.server.test_client().post("/_dash-update-component", json=body)
    assert response.status_code == 200
    return response.get_json()["response"]


def test_one_page_of_rows_is_sent_newest_first(stored):
    app, newest = stored
    out = table(app, None)["runs-table"]
    assert [r["run"] for r in out["data"]] == newest[:PAGE_SIZE]
    assert out["page_count"] == 3 and out["page_current"] == 0


def test_the_last_page_holds_the_oldest_runs(stored):
    app, newest = stored
    out = table(app, "runs-table.page_current", **{"runs-table__page_current": 2})
    assert [r["run"] for r in out["runs-table"]["data"]] == newest[2 * PAGE_SIZE:]
    # a page past the end (the client's number) shows the last page
    out = table(app, "runs-table.page_current", **{"runs-table__page_current": 99})
    assert out["runs-table"]["page_current"] == 2


def test_a_new_filter_starts_on_the_first_page(stored):
    app, newest = stored
    out = table(app, "runs-status.value", **{"runs-table__page_current": 2,
                                              "runs-status__value": "complete"})
    assert out["runs-table"]["page_current"] == 0
    assert [r["run"] for r in out["runs-table"]["data"]] == newest[:PAGE_SIZE]


def test_a_requested_run_opens_on_its_page_selected(stored):
    app, newest = stored
    wanted = newest[PAGE_SIZE + 3]
    out = table(app, None, **{"runs-requested__data": wanted})["runs-table"]
    assert out["page_current"] == 1 and out["selected_rows"] == [3]
    assert out["data"][3]["run"] == wanted


def test_sorting_orders_every_run_not_only_the_page(stored):
    app, newest = stored
    out = table(app, "runs-table.sort_by",
                **{"runs-table__sort_by": [{"column_id": "run", "direction": "asc"}]})
    assert [r["run"] for r in out["runs-table"]["data"]] == sorted(newest)[:PAGE_SIZE]


def test_a_sort_on_no_column_of_the_table_is_refused(stored):
    app, _ = stored
    out = table(app, "runs-table.sort_by",
                **{"runs-table__sort_by": [{"column_id": "secret", "direction": "asc"}]})
    assert "sort by: expected" in json.dumps(out) and "runs-table" not in out


def test_a_run_changed_since_the_index_was_written_shows_as_it_is_now(tmp_path):
    store = RunStore(tmp_path)
    for i in range(3):
        with store.start("exp", fake_info(), Cfg(n=i), tables=tables(ONE)) as run:
            run.save_table("t", pd.DataFrame({"a": [i]}))
    newest = [r.id for r in reversed(store.runs())]  # writes the index
    (tmp_path / newest[0] / "run.json").write_text("{}")
    app = create_app(tmp_path)
    assert app.server.test_client().get("/").status_code == 200
    rows = {r["run"]: r for r in table(app, None)["runs-table"]["data"]}
    assert rows[newest[0]]["status"] == "damaged"
    assert [rows[i]["status"] for i in newest[1:]] == ["complete", "complete"]
