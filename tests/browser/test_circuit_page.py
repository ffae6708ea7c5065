"""The Circuit page in a real browser, on a circuit run of the tiny Llama: the size slider
opens on the smallest circuit that reaches the run's faithfulness level, the graph draws
exactly that circuit's edges, coloured by sign, and the node table links each head to the
pages of the model's other runs."""

from __future__ import annotations

import numpy as np
import pytest

from tests.browser.conftest import figure, serve, stop
from tests.unit.test_circuit_experiment import WORDS
from workbench.harness.experiment import run_experiment
from workbench.views.circuit_graph import NEGATIVE, POSITIVE


@pytest.fixture(scope="module")
def served(tmp_path_factory, llama):
    runs = tmp_path_factory.mktemp("runs")
    cfg = {**WORDS, "task": "ioi", "n_prompts": 4, "templates": 2, "steps": 2, "n_exact": 5,
           "n_boot": 50, "fractions": [0.05, 0.2, 0.5, 1.0], "level": 0.5}
    circuit = run_experiment("circuit", llama, cfg, runs_dir=runs)
    heads = run_experiment("previous-token-heads", llama,
                           {"n_prompts": 2, "n_tokens": 16, "n_repeated": 2, "seq_len": 6,
                            "n_boot": 10, "n_null_draws": 19, "fdr": 0.1}, runs_dir=runs)
    proc, url = serve(runs)
    yield url, circuit, heads
    stop(proc)


def test_the_circuit_page_draws_the_circuit_the_curve_picks(page, served):
    url, run, heads = served
    curve = run.table("faithfulness").sort_values("fraction").reset_index(drop=True)
    edges = run.table("edges")
    reached = curve[curve.faithfulness >= 0.5]
    at = reached.iloc[0] if len(reached) else curve.iloc[-1]
    page.goto(f"{url}/circuit?run={run.id}")
    drawn = figure(page, "circuit-graph", title_contains="the circuit")
    assert f"{int(at.n_edges)} edges" in drawn["layout"]["title"]["text"]
    segments = {}  # colour -> number of line segments (x0, x1, None per edge)
    for trace in drawn["data"]:
        if trace.get("mode") == "lines":
            colour = trace["line"]["color"]
            segments[colour] = segments.get(colour, 0) + len(trace["x"]) // 3
    top = edges.nsmallest(int(at.n_edges), "rank")
    assert segments.get(POSITIVE, 0) == int((top.score > 0).sum())
    assert segments.get(NEGATIVE, 0) == int((top.score < 0).sum())
    fig = figure(page, "circuit-curve", title_contains="faithfulness")
    np.testing.assert_allclose([s["x0"] for s in fig["layout"]["shapes"] if s["type"] == "line"
                                and s.get("x0") == s.get("x1")], [at.fraction])
    note = page.inner_text("#circuit-note")
    assert "CPR" in note and "CMD" in note
    table = page.inner_text("#circuit-node-table")
    used = set(top.sender) | {r.split(".")[0] for r in top.receiver}
    head_nodes = [n for n in used if n.startswith("L") and "H" in n and "MLP" not in n]
    assert all(n in table for n in head_nodes)
    if head_nodes:  # the Heads link opens the model's previous-token-heads run
        link = page.locator("#circuit-node-table a", has_text="Heads").first
        assert f"run={heads.id}" in link.get_attribute("href")
