"""The heads page in headless Chromium: heatmap data, the top-k table, a head's example."""

from __future__ import annotations

import numpy as np
import pytest

from experiments.previous_token_heads.tables import HEAD_SCORES
from tests.browser.conftest import as_array, choose, class_marks, figure, serve, stop
from workbench.harness.experiment import run_experiment
from workbench.recording.reader import Recording
from workbench.scores import classes

SMALL = {"n_prompts": 4, "n_repeated": 4, "n_tokens": 32, "seq_len": 8, "n_boot": 50}


@pytest.fixture(scope="module")
def served(tmp_path_factory, llama, bert):
    runs = tmp_path_factory.mktemp("runs")
    first = run_experiment("previous-token-heads", llama, SMALL, runs_dir=runs)
    second = run_experiment("previous-token-heads", bert, SMALL, runs_dir=runs)
    proc, url = serve(runs)
    yield url, first, second
    stop(proc)


def grid(scores, metric, n_layers, n_heads):
    df = scores[scores.metric == metric]
    out = np.full((n_layers, n_heads), np.nan)
    out[df["layer"], df["head"]] = df["score"]
    return out


def test_heatmap_table_and_example(page, served):
    url, run, _ = served
    scores = run.table("head_scores")
    page.goto(f"{url}/heads?run={run.id}")
    fig = figure(page, "heads-heatmap", title_contains="previous_token")
    np.testing.assert_allclose(as_array(fig["data"][0]["z"]),
                               grid(scores, "previous_token", 2, 4), atol=1e-9)
    # the top-k table is sorted by score and shows the declared columns but the metric
    page.wait_for_selector("#heads-table td")
    headers = [h.strip() for h in page.locator("#heads-table th").all_inner_texts()]
    assert headers == [c for c in HEAD_SCORES.names if c != "metric"]
    first_row = page.locator("#heads-table tbody tr").nth(1).inner_text()
    best = scores[scores.metric == "previous_token"].nlargest(1, "score").iloc[0]
    assert first_row.split()[:2] == [str(best.layer), str(best["head"])]
    # with no click the example shows the best head on the natural prompt
    example = figure(page, "heads-example", title_contains=f"L{best.layer}H{best['head']}")
    rec = Recording.open(run.path / "example")
    np.testing.assert_allclose(as_array(example["data"][0]["z"]),
                               rec.pattern(0, int(best.layer), int(best["head"])), atol=1e-6)
    # choosing duplicate_token switches to the repeated prompt
    choose(page, "heads-metric", "duplicate_token")
    fig = figure(page, "heads-example", title_contains="repeated-random")
    assert "duplicate_token" in fig["layout"]["title"]["text"]


def test_clicking_a_table_row_opens_that_head(page, served):
    url, run, _ = served
    page.goto(f"{url}/heads?run={run.id}")
    page.wait_for_selector("#heads-table td")
    row = page.locator("#heads-table tbody tr").nth(3)
    layer, head = row.inner_text().split()[:2]
    row.locator("td").first.click()
    figure(page, "heads-example", title_contains=f"L{layer}H{head} ")


def test_two_runs_side_by_side(page, served):
    url, run, other = served
    page.goto(f"{url}/heads?run={run.id}&compare={other.id}")
    fig = figure(page, "heads-compare-heatmap", title_contains="(compared)")
    assert "tiny-bert" in fig["layout"]["title"]["text"]
    np.testing.assert_allclose(as_array(fig["data"][0]["z"]),
                               grid(other.table("head_scores"), "previous_token", 2, 4),
                               atol=1e-9)


def cells(rows):
    return {(int(r.layer), int(r.head)) for r in rows.itertuples()}


def test_head_classes_are_marked_at_the_stored_rate_and_at_a_typed_one(page, served):
    url, run, _ = served
    stored = run.table("head_classes")
    rows = stored[stored.head_class == "previous-token"]  # the class of previous_token
    rate = float(rows.fdr.iloc[0])
    page.goto(f"{url}/heads?run={run.id}")
    assert class_marks(page, "heads-heatmap", name=f"previous-token at FDR {rate:g}") == \
        cells(rows[rows.in_class])
    page.wait_for_function("() => document.querySelector('#heads-classes-note')?"
                           ".innerText.includes('heads at FDR')")
    assert page.inner_text("#heads-classes-note") == classes.summary_line(stored,
                                                                          "previous-token")
    # another rate: the heads whose q is at most it, whatever the stored in_class says
    q = rows.q.dropna().sort_values()
    other = float(f"{q.iloc[len(q) // 2]:.3g}")
    want = cells(rows[rows.q <= other])
    assert want and want != cells(rows[rows.in_class])  # the rate changes the marks
    page.fill("#heads-fdr", str(other))
    page.press("#heads-fdr", "Enter")
    assert class_marks(page, "heads-heatmap", name=f"previous-token at FDR {other:g}") == want
    assert page.inner_text("#heads-classes-note").startswith(
        f"previous-token heads at FDR {other:g}: {len(want)} of {len(rows)} ")
    # the class follows the metric, at the rate typed
    choose(page, "heads-metric", "duplicate_token")
    duplicate = stored[stored.head_class == "duplicate-token"]
    assert class_marks(page, "heads-heatmap", name=f"duplicate-token at FDR {other:g}") == \
        cells(duplicate[duplicate.q <= other])
