"""The attention-sinks page in a real headless browser, over runs made on the tiny models."""

from __future__ import annotations

import numpy as np
import pytest

from tests.browser.conftest import as_array, choose, figure, offers_exports, serve, stop
from workbench.harness.experiment import run_experiment

SMALL = {"n_prompts": 4, "seq_len": 16, "stream_tokens": 80, "window": 24, "n_sinks": 4,
         "sink_sweep": (1,), "chunk": 16, "recompute_stride": 8, "n_massive_prompts": 2,
         "n_boot": 50}


@pytest.fixture(scope="module")
def served(tmp_path_factory, llama, bert):
    runs = tmp_path_factory.mktemp("runs")
    decoder = run_experiment("attention-sinks", llama, SMALL, runs_dir=runs)
    encoder = run_experiment("attention-sinks", bert, SMALL, runs_dir=runs)
    proc, url = serve(runs)
    yield url, decoder, encoder
    stop(proc)


def expected_grid(run, input_name: str, metric: str = "first_token") -> np.ndarray:
    """A metric (alpha_1 by default) as a [layer, head] grid, straight from the run's table."""
    scores = run.table("input_scores")
    sink = scores[(scores.input == input_name) & (scores.metric == metric)]
    return sink.pivot(index="layer", columns="head", values="score").to_numpy()


def test_sink_heatmap_shows_alpha_1_of_the_chosen_input(page, served):
    url, run, _ = served
    page.goto(f"{url}/sinks?run={run.id}")
    fig = figure(page, "sinks-heatmap", title_contains="(natural)")
    heatmap = fig["data"][0]
    assert heatmap["type"] == "heatmap"
    np.testing.assert_allclose(as_array(heatmap["z"]), expected_grid(run, "natural"),
                               atol=1e-6)
    assert page.locator("#sinks-heatmap .hm image").count() == 1  # painted
    choose(page, "sinks-input", "repeated_no_bos")
    fig = figure(page, "sinks-heatmap", title_contains="(repeated_no_bos)")
    np.testing.assert_allclose(as_array(fig["data"][0]["z"]),
                               expected_grid(run, "repeated_no_bos"), atol=1e-6)
    choose(page, "sinks-metric", "normalized_entropy")
    fig = figure(page, "sinks-heatmap", title_contains="normalized_entropy (repeated_no_bos)")
    np.testing.assert_allclose(as_array(fig["data"][0]["z"]),
                               expected_grid(run, "repeated_no_bos", "normalized_entropy"),
                               atol=1e-6)


def test_rates_mass_massive_and_streaming_figures(page, served):
    url, run, _ = served
    page.goto(f"{url}/sinks?run={run.id}")
    rates = figure(page, "sinks-rates", title_contains="sink rate")["data"][0]
    table = run.table("sink_rates")
    assert list(rates["x"]) == list(table.input)
    np.testing.assert_allclose(as_array(rates["y"]), table.sink_rate, atol=1e-9)
    mass = figure(page, "sinks-mass", title_contains="where the mass goes")
    stacked = np.sum([as_array(trace["y"]) for trace in mass["data"]], axis=0)
    np.testing.assert_allclose(stacked, 1.0, atol=1e-5)  # the token types cover every key
    massive = figure(page, "sinks-massive", title_contains="massive activations")
    assert {t["name"] for t in massive["data"]} >= {"top1", "median_abs"}
    table = run.table("massive_activations")
    natural = table[(table.input == "natural") & table.sink_head_share.notna()]
    sink_heads = next(t for t in massive["data"] if t["name"].startswith("sink heads"))
    np.testing.assert_allclose(as_array(sink_heads["y"]), natural.sink_head_share, atol=1e-9)
    stream = run.table("streaming_perplexity")
    running = figure(page, "sinks-streaming", title_contains="running mean")
    assert [t["name"] for t in running["data"]] == list(stream.label)
    # each running curve ends at the perplexity over every position past the window
    ends = [as_array(t["y"])[-1] for t in running["data"]]
    np.testing.assert_allclose(ends[:-1], stream.ppl_beyond_window[:-1], rtol=1e-5)
    np.testing.assert_allclose(ends[-1], stream.ppl_matched.iloc[-1], rtol=1e-5)
    page.get_by_text("perplexity in bins of positions").click()
    binned = figure(page, "sinks-streaming", title_contains="by position")
    assert [t["name"] for t in binned["data"]] == list(stream.label)
    page.wait_for_selector("#sinks-streaming-table td")
    assert "4+20" in page.inner_text("#sinks-streaming-table")
    assert page.locator("#sinks-streaming-box").is_visible()


def test_encoder_run_says_why_streaming_is_skipped(page, served):
    url, _, run = served
    page.goto(f"{url}/sinks?run={run.id}")
    figure(page, "sinks-heatmap", title_contains="(natural)")
    page.wait_for_function(
        "() => document.querySelector('#sinks-streaming-note').innerText.includes('skipped')")
    note = page.inner_text("#sinks-streaming-note")
    reason = run.table("skipped").set_index("part").reason["streaming"]
    assert reason in note and "no next-token perplexity" in note
    assert page.locator("#sinks-streaming-box").is_hidden()  # no empty placeholder figure
    assert "[CLS]/[SEP]/punctuation" in page.inner_text("#sinks-summary")


def test_sinks_figures_and_tables_can_be_exported(page, served):
    url, run, _ = served
    page.goto(f"{url}/sinks?run={run.id}")
    figure(page, "sinks-rates", title_contains="sink rate")
    offers_exports(page, "sinks-rates", run.id)
