"""The overview page in headless Chromium: the head classes marked on its heatmap."""

from __future__ import annotations

import pytest

from experiments.head_overview.tables import HEAD_SCORES
from tests.browser.conftest import class_marks, figure, serve, stop
from workbench.harness.experiment import run_experiment
from workbench.scores import classes
from workbench.store.runs import RunStore
from workbench.store.schema import tables


@pytest.fixture(scope="module")
def served(tmp_path_factory, llama):
    runs = tmp_path_factory.mktemp("runs")
    run = run_experiment("head-overview", llama, {"n_boot": 50}, runs_dir=runs)
    # a run written before head classes: its head scores and no head_classes table
    with RunStore(runs).start("head-overview", llama.info, run.config,
                              tables=tables(HEAD_SCORES)) as old:
        old.save_table("head_scores", run.table("head_scores"))
    proc, url = serve(runs)
    yield url, run, RunStore(runs).get(old.id)
    stop(proc)


def cells(rows):
    return {(int(r.layer), int(r.head)) for r in rows.itertuples()}


def test_head_classes_are_marked_at_the_stored_rate_and_at_a_typed_one(page, served):
    url, run, _ = served
    stored = run.table("head_classes")
    # normalized_entropy, the page's first metric, tests no class: the first one is shown
    name = str(stored.head_class.iloc[0])
    rows = stored[stored.head_class == name]
    rate = float(rows.fdr.iloc[0])
    page.goto(f"{url}/overview?run={run.id}")
    figure(page, "overview-heatmap", title_contains="normalized_entropy")
    assert class_marks(page, "overview-heatmap", name=f"{name} at FDR {rate:g}") == \
        cells(rows[rows.in_class])
    assert page.inner_text("#overview-classes-note") == classes.summary_line(stored, name)
    q = rows.q.dropna().sort_values()
    other = float(f"{q.iloc[len(q) // 2]:.3g}")
    want = cells(rows[rows.q <= other])
    assert want and want != cells(rows[rows.in_class])  # the rate changes the marks
    page.fill("#overview-fdr", str(other))
    page.press("#overview-fdr", "Enter")
    assert class_marks(page, "overview-heatmap", name=f"{name} at FDR {other:g}") == want
    assert page.inner_text("#overview-classes-note").startswith(
        f"{name} heads at FDR {other:g}: {len(want)} of {len(rows)} ")


def test_a_run_without_head_classes_marks_nothing_and_says_so(page, served):
    url, _, old = served
    assert "head_classes" not in old.table_names()
    page.goto(f"{url}/overview?run={old.id}")
    page.wait_for_function("() => document.querySelector('#overview-classes-note')?"
                           ".innerText.includes('no head_classes table')")
    fig = figure(page, "overview-heatmap", title_contains="normalized_entropy")
    assert [t["type"] for t in fig["data"]] == ["heatmap"]
    assert page.inner_text("#overview-classes-note") == (
        f"run {old.id} has no head_classes table (written before head classes): no heads "
        "are marked")
