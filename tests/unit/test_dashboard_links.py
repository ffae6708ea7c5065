"""Every kind of run has a page, and the links to a run name that page and the run."""

from __future__ import annotations

import pytest

from workbench.harness.experiment import OTHER_RUN_KINDS, all_experiments


@pytest.fixture(scope="module")
def links():
    from dashboards.app import create_app
    from dashboards.components import links

    create_app("/nonexistent")  # registers the pages
    return links


def test_every_kind_of_run_is_declared_by_a_page(links):
    kinds = {e.name for e in all_experiments() if e.module.startswith("experiments.")}
    kinds |= set(OTHER_RUN_KINDS)
    declared = links.pages_by_experiment()
    assert not kinds - set(declared), f"no page shows {sorted(kinds - set(declared))}"


def test_a_run_opens_in_the_first_page_of_the_nav_that_shows_it(links):
    # record runs are shown by Recording (order 1), Residual stream (order 2) and others
    paths = [p["path"] for p in links.pages_by_experiment()["record"]]
    assert paths[0] == "/recording" and "/residual" in paths
    assert links.page_for("record") == "/recording"
    assert links.page_for("head-overview") == "/overview"
    assert links.page_for("induction-heads") == links.page_for("previous-token-heads") == "/heads"


def test_a_kind_no_page_declares_opens_in_the_runs_page(links):
    assert links.page_for("not-an-experiment") == "/"


def test_a_run_link_carries_the_run_quoted(links):
    assert links.run_link("20260101-120000-x", "attention-sinks") == (
        "/sinks?run=20260101-120000-x")
    assert links.run_link("a b&c", "record") == "/recording?run=a%20b%26c"
