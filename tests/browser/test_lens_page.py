"""The Logit lens page in a real headless browser, over a logit-lens run on the tiny Llama."""

from __future__ import annotations

import numpy as np
import pytest

from tests.browser.conftest import as_array, choose, figure, offers_exports, serve, stop
from workbench.harness.experiment import run_experiment

SMALL = {"prompt_set": "repeated-random", "n_prompts": 2, "read": "all", "n_boot": 20}


@pytest.fixture(scope="module")
def served(tmp_path_factory, llama):
    runs = tmp_path_factory.mktemp("runs")
    run = run_experiment("logit-lens", llama, SMALL, runs_dir=runs)
    proc, url = serve(runs)
    yield url, run
    stop(proc)


def test_the_grid_is_the_stored_lens_with_the_top_tokens(page, served):
    url, run = served
    lens = run.table("lens")
    page.goto(f"{url}/lens?run={run.id}")
    choose(page, "lens-prompt", "prompt 1")
    fig = figure(page, "lens-grid", title_contains="prompt 1: answer probability")
    mine = lens[lens.prompt == 1]
    want = mine.pivot_table(index="layer", columns="position", values="answer_prob")
    np.testing.assert_allclose(as_array(fig["data"][0]["z"]), want.to_numpy(), rtol=1e-9)
    top = mine[mine.layer == mine.layer.max()].sort_values("position").top.tolist()
    assert fig["data"][0]["text"][-1] == top  # the last row: the model's own top tokens
    assert "scale in the lens: frozen" in page.locator("#lens-note").inner_text()
    offers_exports(page, "lens-grid", run.id)


def test_the_means_and_the_direct_effect_bars(page, served):
    url, run = served
    page.goto(f"{url}/lens?run={run.id}")
    layers = figure(page, "lens-layers", title_contains="mean over 2 prompts")
    stored = run.table("lens_layers")
    np.testing.assert_allclose(as_array(layers["data"][0]["y"]), stored.answer_prob, rtol=1e-9)
    direct = run.table("direct_effects")
    bars = figure(page, "lens-direct", title_contains=f"sum over every component "
                                                      f"{direct.effect.sum():.3f}")
    shown = dict(zip(bars["data"][0]["x"], as_array(bars["data"][0]["y"]), strict=True))
    assert shown["embed"] == pytest.approx(float(direct.set_index("component").effect["embed"]))
