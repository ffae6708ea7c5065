"""The heads page in headless Chromium: heatmap data, the top-k table, a head's example."""

from __future__ import annotations

import shutil

import numpy as np
import pandas as pd
import pytest

from experiments.previous_token_heads.tables import HEAD_SCORES, TABLES
from tests.browser.conftest import as_array, choose, class_marks, figure, serve, stop
from workbench.harness.experiment import run_experiment
from workbench.recording.reader import Recording
from workbench.scores import classes
from workbench.store.runs import RunStore

SMALL = {"n_prompts": 4, "n_repeated": 4, "n_tokens": 32, "seq_len": 8, "n_boot": 50}


DEEP = 15
"""The deep run repeats the tiny model's 2 layers this many times: 30 layers, as smollm2."""


@pytest.fixture(scope="module")
def served(tmp_path_factory, llama, bert):
    runs = tmp_path_factory.mktemp("runs")
    first = run_experiment("previous-token-heads", llama, SMALL, runs_dir=runs)
    second = run_experiment("previous-token-heads", bert, SMALL, runs_dir=runs)
    deep_run(runs, first)
    proc, url = serve(runs)
    yield url, first, second
    stop(proc)


def deep_run(runs, run):
    """A stored run of a 30-layer model: ``run``'s tables with its layers repeated
    ``DEEP`` times (the best head stays in the first copy, so its example is ``run``'s)."""
    info = run.meta.model.model_copy(update={"n_layers": 2 * DEEP, "name": "tiny-deep",
                                             "layer_types": ("global",) * 2 * DEEP,
                                             "checksum": "deep"})
    with RunStore(runs).start("previous-token-heads", info, run.config,
                              tables=TABLES) as deep:
        for name in ("head_scores", "head_classes"):
            table = run.table(name)
            deep.save_table(name, pd.concat(
                [table.assign(layer=table.layer + 2 * i) for i in range(DEEP)],
                ignore_index=True))
        shutil.copytree(run.path / "example", deep.dir / "example")


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


def axis_ranges(page, graph_id: str) -> tuple[list[float], list[float]]:
    """The x and y ranges Plotly drew ``graph_id`` with (after any autorange)."""
    ranges = page.evaluate("""(id) => {
        const full = document.querySelector(`#${id} .js-plotly-plot`)._fullLayout;
        return [full.xaxis.range, full.yaxis.range];
    }""", graph_id)
    return ranges[0], ranges[1]


def test_outlined_heads_do_not_widen_the_heatmap_beyond_its_layers_and_heads(page, served):
    url = served[0]
    deep = next(r for r in RunStore(page_runs(served)).runs() if r.model_name == "tiny-deep")
    stored = deep.table("head_classes")
    rows = stored[stored.head_class == "previous-token"]
    page.goto(f"{url}/heads?run={deep.id}")
    rate = float(rows.fdr.iloc[0])
    class_marks(page, "heads-heatmap", name=f"previous-token at FDR {rate:g}")
    page.fill("#heads-fdr", "1")  # every head: marks on every edge of the grid
    page.press("#heads-fdr", "Enter")
    assert class_marks(page, "heads-heatmap", name="previous-token at FDR 1") == cells(rows)
    x_range, y_range = axis_ranges(page, "heads-heatmap")
    # 30 layers and 4 heads: cells centred on 0..29 and 0..3, layer 0 on top
    assert x_range == pytest.approx([-0.5, 3.5]) and y_range == pytest.approx([29.5, -0.5])


def page_runs(served):
    """The run store the served dashboard reads (the folder that holds its runs)."""
    return served[1].path.parent


def test_a_metric_no_class_tests_outlines_no_class(page, served):
    url, _, encoder = served
    assert "next_token" in set(encoder.table("head_scores").metric)
    page.goto(f"{url}/heads?run={encoder.id}")
    figure(page, "heads-heatmap", title_contains="tiny-bert")
    choose(page, "heads-metric", "next_token")
    # the next_token heatmap is drawn with its note, whatever class it outlines
    page.wait_for_function("""() => {
        const el = document.querySelector('#heads-heatmap .js-plotly-plot');
        const note = document.querySelector('#heads-classes-note')?.innerText || '';
        return el && el.layout && el.layout.title.text.includes('next_token')
            && (note.startsWith('no head class') || el.data.length > 1);
    }""")
    names = page.evaluate("() => document.querySelector('#heads-heatmap .js-plotly-plot')"
                          ".data.map(t => t.name || '')")
    assert not [n for n in names if "at FDR" in n]
    assert page.inner_text("#heads-classes-note").startswith("no head class")
