"""The dashboard in a real headless browser: runs, the recording viewer, the residual page."""

from __future__ import annotations

import numpy as np
import pytest

from tests.browser.conftest import as_array, choose, figure, serve, sink_head, stop
from workbench.harness.experiment import run_experiment
from workbench.inputs.prompts import Prompt
from workbench.recording.reader import Recording
from workbench.recording.writer import record
from workbench.store.runs import RunStore

TEXTS = ["the cat sat on the mat", "a quick brown fox jumps over the lazy dog"]


@pytest.fixture(scope="module")
def served(tmp_path_factory, llama):
    runs = tmp_path_factory.mktemp("runs")
    store = RunStore(runs)
    with store.start("record", llama.info, {"source": "test"}) as run:
        record(llama, [Prompt(text=t) for t in TEXTS], run.dir / "recording")
    overview = run_experiment("head-overview", llama, {"n_boot": 50}, runs_dir=runs)
    proc, url = serve(runs)
    yield url, store.get(run.id), overview
    stop(proc)


def test_recording_viewer_opens_on_the_strongest_sink(page, served):
    url, run, _ = served
    rec = Recording.open(run.path)
    layer, head = sink_head(rec)
    page.goto(f"{url}/recording?run={run.id}")
    fig = figure(page, "recording-pattern", title_contains=f"layer {layer}, head {head}")
    np.testing.assert_allclose(as_array(fig["data"][0]["z"]), rec.pattern(0, layer, head),
                               atol=1e-6)
    assert page.inner_text("#recording-layer") == str(layer)
    assert page.inner_text("#recording-head") == str(head)
    # the log scale changes the colours, never the weights
    linear = fig["data"][0]["colorscale"]
    page.get_by_label("log").check()
    page.wait_for_function("""() => {  // the figure redrawn on the log scale
        const el = document.querySelector('#recording-pattern .js-plotly-plot');
        return el && el.data[0].colorbar.title.text === 'weight (log)';
    }""")
    fig = figure(page, "recording-pattern", title_contains=f"layer {layer}, head {head}")
    assert fig["data"][0]["colorscale"] != linear
    np.testing.assert_allclose(as_array(fig["data"][0]["z"]), rec.pattern(0, layer, head),
                               atol=1e-6)
    # one colour bar, ticked at the weights a decade apart (not linearly from 0 to 1), each
    # tick beside the colour the heatmap gives that weight (between two of the colour
    # stops the heatmap blends linearly in the weight and the bar in its log: a few of 255)
    labels = page.evaluate("""() => [...document.querySelectorAll(
        '#recording-pattern g.colorbar text')].map(t => t.textContent)""")
    assert labels == ["weight (log)", "0.0001", "0.001", "0.01", "0.1", "1"] or \
        labels == ["0.0001", "0.001", "0.01", "0.1", "1", "weight (log)"]
    bars = [t["marker"] for t in fig["data"] if t.get("marker", {}).get("showscale")]
    assert len(bars) == 1 and fig["data"][0].get("showscale") is False
    bar = bars[0]
    for tick, text in zip(bar["colorbar"]["tickvals"], bar["colorbar"]["ticktext"],
                          strict=True):
        at = (tick - bar["cmin"]) / (bar["cmax"] - bar["cmin"])
        assert colour_at(bar["colorscale"], at) == pytest.approx(
            colour_at(fig["data"][0]["colorscale"], float(text)), abs=4.0)


def colour_at(stops, at: float) -> np.ndarray:
    """The RGB colour a Plotly colorscale gives the fraction ``at`` of its range."""
    import plotly.colors

    rgb = np.array([plotly.colors.unlabel_rgb(plotly.colors.convert_colors_to_same_type(c)[0][0])
                    for _, c in stops], dtype=float)
    return np.array([np.interp(at, [p for p, _ in stops], rgb[:, i]) for i in range(3)])


def test_recording_viewer_draws_the_selected_head(page, served):
    url, run, _ = served
    rec = Recording.open(run.path)
    page.goto(f"{url}/recording?run={run.id}")
    first = figure(page, "recording-pattern", title_contains="layer ")
    choose(page, "recording-prompt", f"1: {rec.prompts[1].label} "
           f"({len(rec.tokens(1))} tok) " + "".join(rec.tokens(1)[:12]) + "…")
    choose(page, "recording-layer", "1")
    choose(page, "recording-head", "2")
    fig = figure(page, "recording-pattern", title_contains="layer 1, head 2")
    heatmap = fig["data"][0]
    assert heatmap["type"] == "heatmap"
    np.testing.assert_allclose(as_array(heatmap["z"]), rec.pattern(1, 1, 2),
                               atol=1e-6)
    assert [label.split(": ", 1)[1].strip("'") for label in heatmap["x"]] == rec.tokens(1)
    assert first["data"][0]["z"] != heatmap["z"]
    # the heatmap really is painted: plotly renders it as an image inside the graph
    assert page.locator("#recording-pattern .hm image").count() == 1


def test_clicking_the_head_grid_opens_that_head(page, served):
    url, run, _ = served
    page.goto(f"{url}/recording?run={run.id}")
    figure(page, "recording-grid", title_contains="all heads")
    figure(page, "recording-pattern", title_contains="layer ")
    page.wait_for_timeout(500)  # let the graph settle to its final size
    box = page.locator("#recording-grid .nsewdrag").first.bounding_box()
    # layers down (2), heads across (4): click the middle of layer 1, head 3
    x, y = box["x"] + box["width"] * 3.5 / 4, box["y"] + box["height"] * 1.5 / 2
    page.mouse.move(x, y)  # plotly reports the point under the pointer on click
    page.mouse.click(x, y)
    figure(page, "recording-pattern", title_contains="layer 1, head 3")


def test_residual_page_shows_norms(page, served):
    url, run, _ = served
    rec = Recording.open(run.path)
    page.goto(f"{url}/residual?run={run.id}")
    fig = figure(page, "residual-heatmap", title_contains="residual-stream norm")
    norms = as_array(fig["data"][0]["customdata"])
    expected = np.stack([np.linalg.norm(rec.resid(0, b), axis=-1) for b in range(3)])
    np.testing.assert_allclose(norms, expected, rtol=2e-3)
    assert "position 0" in page.inner_text("#residual-stats")


def test_runs_page_filters_and_opens_a_run(page, served):
    url, run, overview = served
    page.goto(url)
    page.wait_for_selector("#runs-table td")
    assert page.locator("#runs-table tbody tr").count() == 3  # header + 2 runs
    choose(page, "runs-experiment", "head-overview")
    page.wait_for_function(
        "() => document.querySelectorAll('#runs-table tbody tr').length === 2")
    assert overview.id in page.inner_text("#runs-table")
    page.locator("#runs-table input[type=radio]").first.check()
    page.wait_for_selector("#runs-detail h3")
    assert overview.id in page.inner_text("#runs-detail")
    choose(page, "runs-experiment", "record")
    page.wait_for_function(  # the filtered table has replaced the previous one
        "() => document.querySelectorAll('#runs-table tbody tr').length === 2 && "
        f"document.querySelector('#runs-table').innerText.includes('{run.id}')")
    page.locator("#runs-table input[type=radio]").first.check()
    page.get_by_text("open in Recording").click()
    page.wait_for_url(f"**/recording?run={run.id}")
    figure(page, "recording-pattern", title_contains="layer ")


def test_runs_page_tells_runs_apart(page, served):
    url, _, overview = served
    page.goto(url)
    page.wait_for_selector("#runs-table td")
    headers = [h.strip() for h in page.locator("#runs-table th").all_inner_texts()]
    assert {"duration", "load", "varies", "sweep"} <= set(headers)
    row = page.locator("#runs-table tbody tr").filter(has_text=overview.id)
    cells = dict(zip(headers, [c.strip() for c in row.locator("td").all_inner_texts()],
                     strict=False))
    assert cells["varies"] == "n_boot=50"  # the one value off head-overview's defaults
    assert cells["load"] == ("busy" if overview.meta.busy else "idle")
    assert cells["sweep"] == "-"
    page.goto(f"{url}/?run={overview.id}")
    page.wait_for_selector("#runs-wall-time")
    assert overview.meta.load_note in page.inner_text("#runs-wall-time")
