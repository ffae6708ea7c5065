"""The Patching page in a real headless browser, over an ioi run on the tiny Llama."""

from __future__ import annotations

import numpy as np
import pytest

from tests.browser.conftest import as_array, choose, figure, offers_exports, serve, stop
from workbench.harness.experiment import run_experiment
from workbench.views import circuit

SMALL = {"names": "and dog on sat the", "places": "dog", "objects": "sat", "n_prompts": 4,
         "templates": 2, "patch_prompts": 2, "n_receivers": 1, "n_boot": 20,
         "min_effect": 0.0, "min_attention": 0.0}
"""No threshold, so that the random model's heads fill some classes and the diagram has
arrows to draw."""


@pytest.fixture(scope="module")
def served(tmp_path_factory, llama):
    runs = tmp_path_factory.mktemp("runs")
    run = run_experiment("ioi", llama, SMALL, runs_dir=runs)
    proc, url = serve(runs)
    yield url, run
    stop(proc)


def test_the_layers_x_positions_heatmap_is_the_stored_grid(page, served):
    url, run = served
    table = run.table("patch_positions")
    page.goto(f"{url}/patching?run={run.id}")
    choose(page, "patching-group", "T0 BABA")
    fig = figure(page, "patching-positions", title_contains="resid_pre patched at one "
                                                            "position, T0 BABA")
    mine = table[(table.group == "T0 BABA") & (table.position >= 0)]
    want = mine.pivot_table(index="layer", columns="position", values="value").to_numpy()
    np.testing.assert_allclose(as_array(fig["data"][0]["z"]), want, rtol=1e-9)
    # the positions carry their tokens and the named positions their roles
    ticks = fig["layout"]["xaxis"]["ticktext"]
    io = int(mine[mine.role == "IO"].position.iloc[0])
    assert ticks[io].startswith(f"{io}:") and ticks[io].endswith("(IO)")
    assert "checks: every position: 1.000 to 1.000; nothing: 0.000 to 0.000" in \
        fig["layout"]["title"]["text"]
    assert "logit difference IO - S at END" in page.locator("#patching-note").inner_text()
    offers_exports(page, "patching-positions", run.id)


def test_clicking_a_cell_shows_its_interval(page, served):
    url, run = served
    page.goto(f"{url}/patching?run={run.id}")
    figure(page, "patching-positions", title_contains="T0 ABBA")
    heads = figure(page, "patching-heads", title_contains="each head's output")
    z = as_array(heads["data"][0]["z"])
    stored = run.table("patch_heads")
    assert z.shape == (2, 4)
    page.locator("#patching-positions .nsewdrag").first.click(position={"x": 30, "y": 30})
    page.wait_for_selector("#patching-cell:has-text('patched at position')")
    text = page.locator("#patching-cell").inner_text()
    assert "[" in text and "over 2 prompts of T0 ABBA" in text
    page.locator("#patching-heads .nsewdrag").first.click(position={"x": 30, "y": 30})
    page.wait_for_selector("#patching-cell:has-text('output patched at every position')")
    row = stored[(stored.layer == 1) & (stored["head"] == 0)].iloc[0]
    assert f"L1H0's output patched at every position: {row.value:.3f}" in \
        page.locator("#patching-cell").inner_text()


def test_the_class_diagram_draws_the_stored_classes(page, served):
    url, run = served
    page.goto(f"{url}/patching?run={run.id}")
    fig = figure(page, "patching-circuit", title_contains="IOI circuit")
    classes = run.table("classes")
    notes = fig["layout"]["annotations"]
    groups = {n["name"]: n["text"] for n in notes if n["name"].startswith("group ")}
    for cls, _, _ in circuit.GROUPS:
        n = int((classes.head_class == cls).sum())
        assert groups[f"group {cls}"] == f"<b>{cls} ({n})</b>"
    empty = {n["name"] for n in notes if n["name"].startswith("empty ")}
    assert empty == {f"empty {cls}" for cls, _, _ in circuit.GROUPS
                     if not (classes.head_class == cls).any()}
    # the name movers' arrows into the logits, one per head of the two classes
    movers = classes[classes.head_class.isin(["name mover", "negative name mover"])]
    into_logits = [n for n in notes if n.get("showarrow") and n["name"].endswith("-> logits")]
    assert len(movers) and len(into_logits) == len(movers)
    assert {n["name"].split(" (")[0] for n in into_logits} == {
        f"L{r.layer}H{r.head}" for r in movers.itertuples()}
    offers_exports(page, "patching-circuit", run.id)
