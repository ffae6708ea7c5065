"""The pruning page in a real browser: importance, curves with the random band, the mask
at a budget, each head's pruning step and the stored join with a head-finding run, each
checked against the run's tables."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tests.browser.conftest import WAIT, as_array, choose, figure, offers_exports, serve, stop
from workbench.harness.experiment import run_experiment
from workbench.store import schema
from workbench.store.runs import RunStore

CONFIG = {"fit_tokens": 128, "ablation_tokens": 32, "eval_tokens": 64, "chunk_tokens": 32,
          "repeat_prompts": 2, "repeat_len": 6, "probes": 2, "step_fraction": 0.25,
          "max_fraction": 0.75, "n_boot": 50, "speed_repeats": 5, "budgets": (0.25, 0.5),
          "importance": ("gradient",), "top_k": 2}


# head scores as a head-finding run stores them, reduced to what the join reads
HEAD_SCORES = schema.tables(schema.Table("head_scores", "scores per head", schema.columns(
    ("layer", "int", "layer"), ("head", "int", "head"), ("metric", "str", "metric"),
    ("score", "float", "score"))))


@pytest.fixture(scope="module")
def served(tmp_path_factory, llama):
    runs = tmp_path_factory.mktemp("runs")
    # a head-finding run on the same weights, which the pruning run joins and stores
    with RunStore(runs).start("induction-heads", llama.info, {},
                              tables=HEAD_SCORES) as found:
        found.save_table("head_scores", pd.DataFrame({
            "layer": np.repeat([0, 1], 4), "head": np.tile(np.arange(4), 2),
            "metric": "induction", "score": np.arange(8.0)}))
    run = run_experiment("head-pruning", llama, CONFIG, runs_dir=runs)
    proc, url = serve(runs)
    yield url, run
    stop(proc)


def grid(df, value="score"):
    out = np.full((int(df.layer.max()) + 1, int(df["head"].max()) + 1), np.nan)
    out[df.layer.to_numpy(), df["head"].to_numpy()] = df[value].to_numpy(dtype=float)
    return out


def test_importance_and_curves(page, served):
    url, run = served
    page.goto(f"{url}/pruning?run={run.id}")
    fig = figure(page, "pruning-importance", title_contains="importance_gradient")
    scores = run.table("head_scores")
    np.testing.assert_allclose(as_array(fig["data"][0]["z"]),
                               grid(scores[scores.metric == "importance_gradient"]), rtol=1e-5)
    fig = figure(page, "pruning-curves", title_contains="heldout_loss vs fraction")
    traces = {t["name"]: t for t in fig["data"]}
    curve = run.table("pruning_curve")
    loss = curve[curve.metric == "heldout_loss"]
    mine = loss[loss.order == "gradient"].sort_values("fraction_pruned")
    np.testing.assert_allclose(as_array(traces["gradient"]["y"]), mine.value, rtol=1e-6)
    rand = loss[loss.order == "random"].groupby("fraction_pruned").value
    np.testing.assert_allclose(as_array(traces["random mean"]["y"]), rand.mean(), rtol=1e-6)
    np.testing.assert_allclose(as_array(traces["random band"]["y"]), rand.min(), rtol=1e-6)
    np.testing.assert_allclose(as_array(traces["random max"]["y"]), rand.max(), rtol=1e-6)
    assert {"reverse-gradient", "random band"} <= set(traces)
    choose(page, "pruning-metric", "second_repeat_loss")
    figure(page, "pruning-curves", title_contains="second_repeat_loss vs fraction")


def test_mask_at_a_budget_and_survival_steps(page, served):
    url, run = served
    page.goto(f"{url}/pruning?run={run.id}")
    figure(page, "pruning-mask", title_contains="budget 25%")
    choose(page, "pruning-budget", "50%")
    fig = figure(page, "pruning-mask", title_contains="budget 50%")
    masks = run.table("masks")
    half = masks[masks.budget == 0.5]
    np.testing.assert_array_equal(as_array(fig["data"][0]["z"]), grid(half, "keep"))
    assert "4 of 8 heads kept" in fig["layout"]["title"]["text"]
    fig = figure(page, "pruning-survival", title_contains="gradient order")
    order = run.table("pruning_order")
    mine = order[order.order == "gradient"]
    expected = grid(mine.assign(step=mine.step.astype(float).fillna(4)), "step")
    np.testing.assert_array_equal(as_array(fig["data"][0]["z"]), expected)
    # click the survival map: the head's history appears
    page.locator("#pruning-survival").scroll_into_view_if_needed()
    page.wait_for_timeout(500)  # let the graph settle to its final size
    box = page.locator("#pruning-survival .nsewdrag").first.bounding_box()
    x, y = box["x"] + box["width"] * 2.5 / 4, box["y"] + box["height"] * 1.5 / 2
    page.mouse.move(x, y)
    page.mouse.click(x, y)
    page.wait_for_function(
        "() => document.querySelector('#pruning-head').innerText.startsWith('L1H2')")
    text = page.inner_text("#pruning-head")
    row = mine[(mine.layer == 1) & (mine["head"] == 2)].iloc[0]
    expected = ("gradient: never pruned" if pd.isna(row.step)
                else f"gradient: step {int(row.step)} ({row.fraction_pruned:.0%} pruned)")
    assert expected in text, text
    assert "random seed 1" in text and "importance_ablation" in text


def test_kinds_of_heads_show_the_stored_join(page, served):
    url, run = served
    page.goto(f"{url}/pruning?run={run.id}")
    page.wait_for_selector("#pruning-kinds-table td", timeout=WAIT * 1000)
    text = page.inner_text("#pruning-kinds-table")
    assert "induction" in text and "L1H3, L1H2" in text
    # the join, recomputed here from the stored order
    order = run.table("pruning_order")
    mine = order[order.order == "gradient"].set_index(["layer", "head"]).survival
    expected = (mine[(1, 3)] + mine[(1, 2)]) / 2
    assert f"{expected:.3f}".rstrip("0") in text
    assert run.table("survival").top_mean_survival.round(3).tolist() == [round(expected, 3)]


def test_figures_come_before_the_summary_which_is_collapsed(page, served):
    url, run = served
    page.goto(f"{url}/pruning?run={run.id}")
    figure(page, "pruning-importance", title_contains="importance_gradient")
    lines = run.meta.summary
    page.wait_for_function("() => document.querySelector('#pruning-summary-title')"
                           f".innerText.includes('({len(lines)} lines)')")
    # every figure precedes the list in the page (DOCUMENT_POSITION_FOLLOWING = 4)
    for graph in ("pruning-importance", "pruning-curves", "pruning-mask", "pruning-survival"):
        assert page.evaluate(f"""() => document.querySelector('#{graph}')
            .compareDocumentPosition(document.querySelector('#pruning-summary')) & 4""")
    assert page.locator("#pruning-summary").is_hidden()  # collapsed until opened
    page.click("#pruning-summary-title")
    shown = page.locator("#pruning-summary li").all_inner_texts()
    assert [t.strip() for t in shown] == [line.strip() for line in lines]
    offers_exports(page, "pruning-curves", run.id)


def test_the_speed_up_shows_its_median_range_and_load(page, served):
    url, run = served
    speed = run.table("speedup")
    page.goto(f"{url}/pruning?run={run.id}")
    page.wait_for_selector("#pruning-speed-table td", timeout=WAIT * 1000)
    headers = [h.strip() for h in page.locator("#pruning-speed-table th").all_inner_texts()]
    assert {"speedup", "speedup range", "full range", "removed range", "load",
            "busy"} <= set(headers)
    rows = page.locator("#pruning-speed-table tbody tr")
    first = dict(zip(headers, [c.strip() for c in rows.nth(1).locator("td").all_inner_texts()],
                     strict=False))
    low, high = speed.speedup_low.iloc[0], speed.speedup_high.iloc[0]
    assert low <= speed.speedup.iloc[0] <= high and speed.repeats.iloc[0] == 5
    assert first["speedup range"] == f"{low:.3g} to {high:.3g}"
    assert first["busy"] == ("busy" if speed.busy.iloc[0] else "idle")
    assert "median of interleaved pairs" in page.inner_text("#pruning-speed-note")
