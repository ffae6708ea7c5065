"""The Sweeps page in a real browser, over a stored sweep of previous-token-heads on every
checkpoint of a tiny formation run: the mosaic and the line over training carry the sweep's
table, the top-k view ranks each cell's heads, and clicking a cell links to its run.

The cells run in this process (the Ray side is tested in tests/integration)."""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import pytest

from tests.browser.conftest import as_array, choose, figure, serve, stop
from workbench.harness.experiment import run_experiment
from workbench.harness.sweeps import cluster, runner
from workbench.harness.sweeps.spec import expand, parse_spec
from workbench.harness.sweeps.tables import TABLES
from workbench.store.runs import RunStore

TEXT = ("A module is a file containing Python definitions and statements. The module name is "
        "the file name without the suffix. Return the number of items in the container.")
FORMATION = {"vocab_size": 320, "d_model": 16, "n_heads": 2, "n_ctx": 40, "steps": 8,
             "checkpoint_every": 4, "batch_size": 4, "warmup_steps": 2, "lr": 0.03,
             "heldout_windows": 4, "icl_early": 5, "icl_late": 36, "icl_band": 2,
             "n_repeat_prompts": 3, "repeat_len": 8, "pattern_len": 6, "n_boot": 20,
             "composition": False, "sources": ()}
METRIC = "previous_token (previous-token-heads)"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    runs = tmp_path_factory.mktemp("runs")
    text = tmp_path_factory.mktemp("text") / "text.txt"
    text.write_text("\n\n".join(f"{i}: {TEXT}" for i in range(40)))
    formation = run_experiment("induction-formation", None,
                               {**FORMATION, "text_files": (str(text),)}, runs_dir=runs)
    spec = parse_spec({"experiments": ["previous-token-heads"],
                       "models": [f"{formation.id}/L*:*"],
                       "set": {"n_prompts": 3, "n_repeated": 3, "n_tokens": 32, "seq_len": 8,
                               "n_boot": 20}})
    cells = expand(spec, runs)
    store = RunStore(runs)
    since = datetime.now(UTC).isoformat(timespec="seconds")
    outcomes = {c.index: cluster.run_cell(c, str(runs), "float32", 1, {}) for c in cells}
    with store.start("sweep", None, spec.to_dict(), tables=TABLES) as active:
        runner.record_cells(active, store, cells, outcomes, since)
    proc, url = serve(runs)
    yield url, store.get(active.id)
    stop(proc)


def _scores(run):
    scores = run.table("scores")
    return scores[scores.metric == "previous_token"]


def test_the_mosaic_shows_every_head_of_every_cell(page, served):
    url, run = served
    page.goto(f"{url}/sweeps?run={run.id}")
    choose(page, "sweeps-metric", METRIC)
    fig = figure(page, "sweeps-mosaic", title_contains="previous_token of every head")
    z = as_array(fig["data"][0]["z"])
    scores = _scores(run)
    order = scores.drop_duplicates("cell").sort_values(["series", "step"]).cell.tolist()
    assert z.shape == (6, 4)  # 2 models x 3 checkpoints; L1 fills only its 2 heads
    for i, cell in enumerate(order):
        mine = scores[scores.cell == cell]
        want = np.full(4, np.nan)
        want[mine.layer * 2 + mine["head"]] = mine.score
        np.testing.assert_allclose(z[i], want, rtol=1e-6)
    assert fig["data"][0]["x"] == ["L0H0", "L0H1", "L1H0", "L1H1"]
    assert "95% CI" in fig["data"][0]["hovertemplate"]
    assert page.locator("#sweeps-summary").inner_text() == "6 cells: 6 complete."

    page.get_by_text("top-k heads").click()
    page.fill("#sweeps-k", "2")
    top = figure(page, "sweeps-mosaic", title_contains="top 2 heads")
    ranked = as_array(top["data"][0]["z"])
    for i, cell in enumerate(order):
        best = np.sort(scores[scores.cell == cell].score.to_numpy())[::-1][:2]
        np.testing.assert_allclose(ranked[i], best, rtol=1e-6)


def test_the_line_view_is_the_best_head_against_tokens_seen(page, served):
    url, run = served
    page.goto(f"{url}/sweeps?run={run.id}")
    choose(page, "sweeps-metric", METRIC)
    fig = figure(page, "sweeps-lines", title_contains="max previous_token over heads")
    scores = _scores(run)
    assert sorted(t["name"] for t in fig["data"]) == ["L1", "L2"]
    for trace in fig["data"]:
        mine = scores[scores.series.str.endswith("/" + trace["name"])]
        best = mine.groupby("tokens").score.max()
        np.testing.assert_allclose(as_array(trace["x"]), best.index.to_numpy())
        np.testing.assert_allclose(as_array(trace["y"]), best.to_numpy(), rtol=1e-6)
        rows = mine.loc[mine.groupby("tokens").score.idxmax()]
        np.testing.assert_allclose(as_array(trace["error_y"]["array"]),
                                   (rows.ci_high - rows.score).to_numpy(), rtol=1e-5)


def test_clicking_a_cell_links_to_its_run(page, served):
    url, run = served
    page.goto(f"{url}/sweeps?run={run.id}")
    fig = figure(page, "sweeps-mosaic", title_contains="of every head")
    n_rows, n_cols = as_array(fig["data"][0]["z"]).shape
    page.wait_for_timeout(500)  # let the graph settle to its final size
    box = page.locator("#sweeps-mosaic .nsewdrag").first.bounding_box()
    x, y = box["x"] + box["width"] * 0.5 / n_cols, box["y"] + box["height"] * 0.5 / n_rows
    page.mouse.move(x, y)  # plotly reports the point under the pointer on click
    page.mouse.click(x, y)
    link = page.locator("#sweeps-open-link")
    link.wait_for()
    cells = run.table("cells").sort_values(["series", "step"])
    first = cells.run_id.iloc[0]
    assert link.get_attribute("href").endswith(f"?run={first}")
    link.click()
    page.wait_for_url(f"**?run={first}")
