"""The dashboard over a store with damaged runs, in a real headless browser: every page
renders, damaged runs are listed with their reason, a bad ``?run=`` or a table that fails
its checksum is a message in the page, and the Recording page opens the newest complete
run rather than the newer damaged one."""

from __future__ import annotations

import pytest

from tests.browser.conftest import figure, serve, stop
from tests.robustness.test_dashboard_paths import DAMAGED, damaged_runs, record_run
from workbench.store.runs import RunStore

PAGES = {"": "Runs", "recording": "Recording", "residual": "Residual stream", "heads": "Heads",
         "sinks": "Attention sinks", "pruning": "Pruning", "formation": "Formation",
         "equivariance": "Equivariance"}


@pytest.fixture(scope="module")
def served(tmp_path_factory, llama):
    runs = tmp_path_factory.mktemp("damaged") / "runs"
    healthy = record_run(RunStore(runs), llama, "healthy")
    checksum, damaged, _ = damaged_runs(runs)
    proc, url = serve(runs)
    yield url, healthy, checksum, damaged
    stop(proc)


def test_a_store_with_damaged_runs_renders_every_page(page, served):
    url, healthy, checksum, damaged = served
    for path, title in PAGES.items():
        page.goto(f"{url}/{path}")
        page.wait_for_selector(f"main h2:text-is('{title}')")

    page.goto(url)
    rows = len(DAMAGED) + 4  # and the header, the healthy, bad-checksum and interrupted runs
    page.wait_for_function(
        f"() => document.querySelectorAll('#runs-table tbody tr').length === {rows}")
    table = page.inner_text("#runs-table")
    for name, reason in DAMAGED.items():
        assert name in table and reason in table, name

    page.goto(f"{url}/recording")  # the newest record run is damaged; the healthy one opens
    figure(page, "recording-pattern", title_contains="layer ")
    assert page.inner_text("#recording-run").endswith(healthy[-4:])  # the label ends so

    page.goto(f"{url}/recording?run={damaged}")
    page.wait_for_selector(".wb-error")
    assert f"run {damaged} is damaged" in page.inner_text("main")

    page.goto(f"{url}/recording?run=/etc")
    page.wait_for_selector(".wb-error")
    assert "no such run '/etc'" in page.inner_text("main")

    page.goto(f"{url}/heads?run={checksum}")  # listed complete, but its table is damaged
    page.wait_for_selector("#heads-error .wb-error")
    assert "checksum mismatch" in page.inner_text("#heads-error")

    page.click("#nav-recording")  # the other pages keep working
    figure(page, "recording-pattern", title_contains="layer ")
