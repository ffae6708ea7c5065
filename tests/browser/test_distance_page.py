"""The Induction distance page in a real headless browser, over an induction-distance run
on the tiny Gemma 3 with an 8-key sliding window."""

from __future__ import annotations

import numpy as np
import pytest

from tests import tiny
from tests.architectures.families import build
from tests.browser.conftest import WAIT, as_array, choose, figure, offers_exports, serve, stop
from workbench.harness.experiment import run_experiment

SMALL = {"n_prompts": 2, "seq_len": 4, "distances": (4, 8, 12, 24), "n_boot": 20}


@pytest.fixture(scope="module")
def served(tmp_path_factory, tokenizer):
    model = tiny.wrap(build("gemma-3", len(tokenizer)), tokenizer, "tiny-gemma3")
    runs = tmp_path_factory.mktemp("runs")
    run = run_experiment("induction-distance", model, SMALL, runs_dir=runs)
    proc, url = serve(runs)
    yield url, run
    stop(proc)


def test_the_curves_open_on_the_best_heads_and_mark_the_window(page, served):
    url, run = served
    scores = run.table("distance_scores")
    page.goto(f"{url}/distance?run={run.id}")
    fig = figure(page, "distance-curves", title_contains="against the distance")
    near = scores[scores.distance == 4].nlargest(4, "score")
    names = [f"L{r.layer}H{r.head} ({r.layer_type})" for r in near.itertuples()]
    curves = [trace for trace in fig["data"] if trace.get("name")]
    assert [trace["name"] for trace in curves] == names
    best = near.iloc[0]
    mine = scores[(scores.layer == best.layer) & (scores["head"] == best["head"])]
    np.testing.assert_allclose(as_array(curves[0]["y"]), mine.sort_values("distance").score,
                               rtol=1e-9)
    assert any("window 8" in a.get("text", "") for a in fig["layout"].get("annotations", []))
    assert "past D = 8 their target is out of reach" in page.locator(
        "#distance-note").inner_text()
    offers_exports(page, "distance-curves", run.id)


def test_another_head_and_the_layer_and_loss_figures(page, served):
    url, run = served
    page.goto(f"{url}/distance?run={run.id}")
    layers = figure(page, "distance-layers", title_contains="best head")
    z = as_array(layers["data"][0]["z"])
    assert (z[0, 2:] == 0).all() and (z[1] > 0).all()  # sliding layer 0 is blind past 8
    loss = figure(page, "distance-loss", title_contains="loss drop")
    np.testing.assert_allclose(as_array(loss["data"][0]["y"]),
                               run.table("distance_losses").sort_values("distance")["drop"],
                               rtol=1e-9)
    scores = run.table("distance_scores")
    near = scores[scores.distance == 4].sort_values("score", ascending=False)
    extra = near.iloc[-1]  # the weakest head at the shortest distance: not shown at first
    name = f"L{extra.layer}H{extra['head']}"
    choose(page, "distance-heads", name)
    page.wait_for_function(
        "name => document.querySelector('#distance-curves .js-plotly-plot')?.data"
        "?.some(t => t.name && t.name.startsWith(name))", arg=name, timeout=WAIT * 1000)
    fig = figure(page, "distance-curves", title_contains="against the distance")
    assert [t["name"] for t in fig["data"] if t.get("name")][-1] == (
        f"{name} ({extra.layer_type})")
