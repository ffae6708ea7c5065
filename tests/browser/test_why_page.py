"""The Why page in a real headless browser, over a qk-attribution run on the tiny Llama."""

from __future__ import annotations

import numpy as np
import pytest

from tests.browser.conftest import as_array, choose, figure, offers_exports, serve, stop
from workbench.harness.experiment import run_experiment

SMALL = {"n_prompts": 3, "seq_len": 8, "n_heads": 2, "n_previous": 1, "n_random": 3,
         "n_boot": 20, "patch_prompts": 1, "n_patch": 1}


@pytest.fixture(scope="module")
def served(tmp_path_factory, llama):
    runs = tmp_path_factory.mktemp("runs")
    run = run_experiment("qk-attribution", llama, SMALL, runs_dir=runs)
    proc, url = serve(runs)
    yield url, run
    stop(proc)


def test_strip_bars_and_matrix_of_the_chosen_pair(page, served):
    url, run = served
    scores = run.table("scores")
    layer, head = (int(v) for v in scores[["layer", "head"]].drop_duplicates()
                   .sort_values(["layer", "head"]).iloc[-1])
    page.goto(f"{url}/why?run={run.id}")
    choose(page, "why-head", f"L{layer}H{head}")
    mine = scores[(scores.layer == layer) & (scores["head"] == head) & (scores.prompt == 0)]
    first = mine.iloc[0]  # a row of mixed columns: its ints read back as floats
    query_pos, key_pos = int(first.query_pos), int(first.key_pos)
    want = f"L{layer}H{head}, query {query_pos}"
    key = figure(page, "why-key", title_contains=f"key side: {want}")["data"][0]
    # the bars are the stored parts, and they add up to the model's own score
    assert as_array(key["y"]).sum() == pytest.approx(first.score, rel=1e-4, abs=1e-7)
    assert key["x"][0] == "embed"
    query = figure(page, "why-query", title_contains=f"query side: {want}")["data"][0]
    assert as_array(query["y"]).sum() == pytest.approx(first.score, rel=1e-4, abs=1e-7)
    cells = figure(page, "why-pairs", title_contains=f"pairs: {want}")["data"][0]
    assert np.nansum(as_array(cells["z"])) == pytest.approx(first.score, rel=1e-4, abs=1e-7)
    strip = figure(page, "why-strip", title_contains=f"L{layer}H{head}: attention of query "
                                                      f"{query_pos}")
    weights = as_array(strip["data"][0]["z"])[0]
    assert weights[key_pos] == pytest.approx(first.weight, rel=1e-5)
    assert weights[: query_pos + 1].sum() == pytest.approx(1.0, abs=1e-5)
    offers_exports(page, "why-key", run.id)


def test_aggregate_with_intervals_and_the_link_back(page, served):
    url, run = served
    page.goto(f"{url}/why?run={run.id}")
    fig = figure(page, "why-aggregate", title_contains="mean over 3 prompts")
    assert [t["name"] for t in fig["data"]] == ["key side", "query side"]
    att = run.table("attribution")
    first = att[(att.layer == att.layer.min()) & (att.side == "key")]
    shown = dict(zip(fig["data"][0]["x"], as_array(fig["data"][0]["y"]), strict=True))
    assert shown["embed"] == pytest.approx(
        float(first[first.component == "embed"].contribution.iloc[0]), rel=1e-6)
    link = page.locator("#why-heads-link")
    assert link.get_attribute("href").endswith("/heads")  # heads were scored in the run
    assert "kv group" in page.locator("#why-note").inner_text()


def test_a_path_for_a_run_is_refused(page, served):
    url, _ = served
    page.goto(f"{url}/why?run=../../etc")
    page.wait_for_selector("text=no such run")
