"""A head-masked run says so in the browser: its label in a run dropdown, the Runs page's
``varies`` cell and provenance panel, and the Heads page's heatmap title."""

from __future__ import annotations

import pytest

from tests.browser.conftest import figure, serve, stop
from workbench.harness.experiment import run_experiment
from workbench.interventions.masks import HeadMask

SMALL = {"n_prompts": 4, "n_repeated": 4, "n_tokens": 32, "seq_len": 8, "n_boot": 50}
SHORT = "2 heads mean-ablated (L0H1, L1H3)"
"""The short form of the mask below, written by hand."""


@pytest.fixture(scope="module")
def served(tmp_path_factory, llama):
    runs = tmp_path_factory.mktemp("runs")
    plain = run_experiment("previous-token-heads", llama, SMALL, runs_dir=runs)
    mask = HeadMask.ones(2, 4, ablation="mean").without([(0, 1), (1, 3)])
    masked = run_experiment("previous-token-heads", llama, SMALL, runs_dir=runs,
                            heads_mask=mask)
    proc, url = serve(runs)
    yield url, plain, masked
    stop(proc)


def test_the_runs_page_shows_a_masked_runs_interventions(page, served):
    url, plain, masked = served
    page.goto(url)
    page.wait_for_selector("#runs-table td")
    headers = [h.strip() for h in page.locator("#runs-table th").all_inner_texts()]

    def varies(run_id: str) -> str:
        row = page.locator("#runs-table tbody tr").filter(has_text=run_id)
        cells = [c.strip() for c in row.locator("td").all_inner_texts()]
        return dict(zip(headers, cells, strict=False))["varies"]

    off_defaults = "n_boot=50, n_prompts=4, n_repeated=4, n_tokens=32, seq_len=8"
    assert varies(masked.id) == f"{SHORT}, {off_defaults}"
    assert varies(plain.id) == off_defaults
    page.goto(f"{url}/?run={masked.id}")
    page.wait_for_selector("#runs-interventions")
    assert page.inner_text("#runs-interventions") == f"interventions: {SHORT}"


def test_the_heads_page_labels_and_titles_a_masked_run(page, served):
    url, _, masked = served
    page.goto(f"{url}/heads?run={masked.id}")
    heatmap = figure(page, "heads-heatmap", title_contains=SHORT)
    assert "previous_token" in heatmap["layout"]["title"]["text"]
    page.wait_for_function(
        "([want]) => document.querySelector('#heads-run').innerText.includes(want)",
        arg=[SHORT])
    page.click("#heads-run")
    labels = page.locator("[role=listbox] [role=option]").all_inner_texts()
    assert sum(SHORT in label for label in labels) == 1  # the masked run's, not the plain one's
