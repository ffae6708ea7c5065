"""The long-context view in a real browser, on an 8,192-token top-k recording of a tiny
model (smollm2's context; the page on smollm2's own 8k recording is timed in
benchmarks/long_context.py): the pooled overview, pooling switch, a box drawn on it opening
a token-level window, and a clicked query's top keys."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import LlamaForCausalLM

from tests import tiny
from tests.browser.conftest import as_array, figure, serve, stop
from workbench.inputs.prompts import Prompt
from workbench.recording.reader import Recording
from workbench.recording.writer import record
from workbench.store.runs import RunStore

N = 8192
F = N // 512  # tokens a side of an overview cell


@pytest.fixture(scope="module")
def served(tmp_path_factory, llama_hf, tokenizer):
    config = llama_hf.config.to_dict() | {"max_position_embeddings": N}
    torch.manual_seed(1)
    hf = LlamaForCausalLM(type(llama_hf.config)(**config)).eval()
    model = tiny.wrap(hf, tokenizer, "tiny-llama-8k")
    rng = np.random.default_rng(0)
    ids = [0, *rng.integers(10, 290, N // 2 - 1).tolist()]
    ids = ids + ids[1:] + [5]  # a repeated half: stripes at distance N/2 - 1
    runs = tmp_path_factory.mktemp("long") / "runs"
    store = RunStore(runs)
    with store.start("record", model.info, {"source": "test"}) as run:
        record(model, [Prompt(token_ids=tuple(ids), label="long")], run.dir / "recording",
               include_resid=False)
    with store.start("record", model.info, {"source": "test", "patterns": "qk"}) as exact:
        record(model, [Prompt(token_ids=tuple(ids), label="long")], exact.dir / "recording",
               include_resid=False, patterns="qk")
    rec = Recording.open(store.get(run.id).path)
    assert rec.patterns == "topk" and rec.length(0) == N  # auto: topk above 1,024 tokens
    proc, url = serve(runs)
    yield url, run.id, rec, Recording.open(store.get(exact.id).path)
    stop(proc)


def opening_head(rec) -> tuple[int, int]:
    """The head with the largest mean weight on the first key, from the dense view of
    every query row (the stored top-k rows hold the first key's weight exactly)."""
    def mass(layer: int, head: int) -> float:
        column = [rec.pattern(0, layer, head, queries=(q, min(q + 1024, N)))[:, 0]
                  for q in range(0, N, 1024)]  # a dense 8k pattern at once would be 256 MB
        return float(np.concatenate(column)[1:].mean())

    masses = np.array([[mass(layer, head) for head in range(rec.n_heads)]
                       for layer in range(rec.n_layers)])
    layer, head = np.unravel_index(int(np.argmax(masses)), masses.shape)
    return int(layer), int(head)


def test_overview_window_and_top_keys(page, served):
    url, run_id, rec, _ = served
    layer, head = opening_head(rec)
    page.goto(f"{url}/long-context?run={run_id}")
    fig = figure(page, "long-context-overview",
                 title_contains=f"L{layer}H{head}, whole pattern")
    assert f"max pooling of {F} x {F} tokens a cell" in fig["layout"]["title"]["text"].replace(
        "<br>", " ")
    assert fig["data"][0]["colorbar"]["title"]["text"] == "max (log)"  # opens on the log scale
    # and lists the last query's top keys
    page.wait_for_function("document.querySelector('#long-context-topk').innerText"
                           f".includes('query {N - 1} ')")
    grid = as_array(fig["data"][0]["z"])
    assert grid.shape == (512, 512)
    view = rec.pattern(0, layer, head, queries=(0, 16 * F))  # the dense view of the top-k
    reference = view.reshape(16, F, N // F, F).max(axis=(1, 3))
    np.testing.assert_allclose(grid[:16], reference, atol=1e-6)

    page.get_by_label("sum").check()
    fig = figure(page, "long-context-overview", title_contains=f"sum pooling of {F} x {F}")
    np.testing.assert_allclose(as_array(fig["data"][0]["z"])[:16],
                               view.reshape(16, F, N // F, F).sum(axis=(1, 3)), atol=1e-5)
    page.get_by_label("max").check()
    figure(page, "long-context-overview", title_contains="max pooling")

    # a box drawn on the overview (Plotly's zoom) opens that window, token by token
    page.evaluate("""() => Plotly.relayout(
        document.querySelector('#long-context-overview .js-plotly-plot'),
        {'xaxis.range[0]': 1000, 'xaxis.range[1]': 1048,
         'yaxis.range[0]': 1070, 'yaxis.range[1]': 1030})""")
    fig = figure(page, "long-context-window",
                 title_contains="queries 1030..1077, keys 1000..1047")
    assert "1 token a cell" in fig["layout"]["title"]["text"]
    window = as_array(fig["data"][0]["z"])
    np.testing.assert_allclose(window,
                               rec.pattern(0, layer, head, queries=(1030, 1078))[:, 1000:1048],
                               atol=1e-6)
    labels = fig["data"][0]["x"]  # keys labelled with their tokens
    assert labels[0] == f"1000 {rec.tokens(0)[1000]!r}"[:20] and len(labels) == 48

    box = page.locator("#long-context-window .nsewdrag").first.bounding_box()
    page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.wait_for_function("""() => {  // a clicked cell's query is the one listed
        const q = Number(document.querySelector('#long-context-query').value);
        return q >= 1030 && q < 1078 &&
            document.querySelector('#long-context-topk').innerText.includes('query ' + q);
    }""")

    page.fill("#long-context-query", "1500")
    page.press("#long-context-query", "Enter")
    page.wait_for_selector("#long-context-topk-table")
    page.wait_for_function(
        "document.querySelector('#long-context-topk').innerText.includes('query 1500')")
    rows = page.locator("#long-context-topk-table tbody tr")
    sparse = rec.pattern_sparse(0, layer, head, queries=(1500, 1501))
    best = int(sparse.keys[0, 0])
    assert rows.first.locator("td").nth(1).inner_text() == str(best)
    assert best == int(np.argmax(rec.pattern(0, layer, head, queries=(1500, 1501))[0]))
    assert "left out of the top 16" in page.inner_text("#long-context-topk-exact")


def test_a_qk_recording_draws_exact_weights_and_what_each_key_receives(page, served):
    """Every weight the page draws from a qk recording is the stored queries' and keys'
    (``Recording.tile``, itself checked against dense recordings), and the received strip
    is each key's column sum, max-pooled like the overview; the top-k recording's strip
    says it is a lower bound."""
    url, topk_id, _, rec = served
    page.goto(f"{url}/long-context?run={rec.root.parent.name}")
    overview = figure(page, "long-context-overview", title_contains="whole pattern")
    layer, head = (int(x) for x in overview["layout"]["title"]["text"][1:].split(",")[0]
                   .split("H"))
    tiles = rec.tile(0, layer, head, queries=slice(0, 16 * F))
    np.testing.assert_allclose(as_array(overview["data"][0]["z"])[:16],
                               tiles.reshape(16, F, N // F, F).max(axis=(1, 3)), atol=1e-6)
    strip = figure(page, "long-context-received", title_contains=f"max of {F} keys a bar")
    assert "lower bound" not in strip["layout"]["title"]["text"]
    received = rec.received(0, layer, head)
    np.testing.assert_allclose(as_array(strip["data"][0]["y"]),
                               received.reshape(-1, F).max(axis=1), rtol=1e-5)
    np.testing.assert_allclose(received.sum(), N, rtol=1e-4)  # each query's weights sum to 1
    page.evaluate("""() => Plotly.relayout(
        document.querySelector('#long-context-overview .js-plotly-plot'),
        {'xaxis.range[0]': 4000, 'xaxis.range[1]': 4040,
         'yaxis.range[0]': 4140, 'yaxis.range[1]': 4100})""")
    window = figure(page, "long-context-window",
                    title_contains="queries 4100..4139, keys 4000..4039")
    np.testing.assert_allclose(as_array(window["data"][0]["z"]),
                               rec.tile(0, layer, head, queries=slice(4100, 4140),
                                        keys=slice(4000, 4040)), atol=1e-6)
    page.goto(f"{url}/long-context?run={topk_id}")
    figure(page, "long-context-received", title_contains="a lower bound")
