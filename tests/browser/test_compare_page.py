"""The Compare page in a real headless browser, over a clean and a head-masked
induction-heads run on the tiny Llama: it loads without console errors, names each run's
interventions in its heading, and shows the differences table with intervals."""

from __future__ import annotations

import pytest

from tests.browser.conftest import serve, stop
from tests.dashboard_runs import CONFIGS
from workbench.harness.experiment import run_experiment
from workbench.interventions.masks import HeadMask


@pytest.fixture(scope="module")
def served(tmp_path_factory, llama):
    runs = tmp_path_factory.mktemp("runs")
    config = CONFIGS["induction-heads"]
    clean = run_experiment("induction-heads", llama, config, runs_dir=runs)
    mask = HeadMask.for_model(llama, ablation="zero").without([(1, 0), (1, 2)])
    masked = run_experiment("induction-heads", llama, config, runs_dir=runs, heads_mask=mask)
    other = run_experiment("head-overview", llama, {"n_boot": 20}, runs_dir=runs)
    proc, url = serve(runs)
    yield url, clean, masked, other
    stop(proc)


def test_the_page_shows_the_paired_differences_of_two_runs(page, served):
    url, clean, masked, _ = served
    page.goto(f"{url}/compare?run={clean.id}&other={masked.id}")
    page.wait_for_selector("#compare-title:has-text('2 heads zero-ablated (L1H0, L1H2)')")
    title = page.locator("#compare-title").inner_text()
    assert "A (none) vs B (2 heads zero-ablated (L1H0, L1H2))" in title
    table = page.locator("#compare-differences")
    table.locator("td[data-dash-column='table']").first.wait_for()
    assert table.locator("th", has_text="ci_low").count() >= 1
    cells = table.locator("td[data-dash-column='table']").all_inner_texts()
    assert cells[0] == "repeat_loss_by_prompt"  # the paired tables first
    pairing = table.locator("td[data-dash-column='pairing']").first.inner_text()
    assert pairing == "same prompts"
    config = page.locator("#compare-config").inner_text()
    assert "interventions" in config and "n_prompts" in config


def test_two_runs_of_different_experiments_are_refused_in_one_line(page, served):
    url, clean, _, other = served
    page.goto(f"{url}/compare?run={clean.id}&other={other.id}")
    page.wait_for_selector("#compare-error:has-text('cannot compare')")
    text = page.locator("#compare-error").inner_text()
    assert "differ in experiment (induction-heads vs head-overview)" in text
    assert "\n" not in text.strip()
    assert page.locator("#compare-differences td").count() == 0
