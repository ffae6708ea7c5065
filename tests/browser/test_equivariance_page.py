"""The equivariance page in a real browser: verdicts, a head before and after a permutation,
and the worked four-token example."""

from __future__ import annotations

import numpy as np
import pytest

from tests.browser.conftest import as_array, choose, figure, offers_exports, serve, stop
from workbench.harness.experiment import run_experiment
from workbench.scores.attention import worked_example

CONFIG = {"n_prompts": 2, "max_tokens": 10, "seeds": (0, 1), "shifts": (1, 10),
          "view_prompts": 2}


@pytest.fixture(scope="module")
def served(tmp_path_factory, llama):
    runs = tmp_path_factory.mktemp("runs")
    run = run_experiment("permutation-equivariance", llama, CONFIG, runs_dir=runs)
    proc, url = serve(runs)
    yield url, run
    stop(proc)


def stored(run, condition, prompt, layer, head, seed):
    """The stored original and permuted patterns, and the permutation, as numpy arrays."""
    patterns = run.table("patterns")
    pick = patterns[(patterns.condition == condition) & (patterns.prompt == prompt)
                    & (patterns.layer == layer) & (patterns["head"] == head)]
    n = int(pick["query"].max()) + 1

    def grid(rows):
        out = np.zeros((n, n))
        out[rows["query"], rows["key"]] = rows.weight
        return out

    perms = run.table("permutations")
    perm = perms[(perms.prompt == prompt) & (perms.seed == seed) & (perms.kind == "full")]
    return (grid(pick[pick.input == "original"]), grid(pick[pick.seed == seed]),
            perm.sort_values("position").source.to_numpy())


def test_verdicts_table_lists_every_condition(page, served):
    url, run = served
    page.goto(f"{url}/equivariance?run={run.id}")
    page.wait_for_selector("#equivariance-verdicts td")
    text = page.inner_text("#equivariance-verdicts")
    verdicts = run.table("verdicts")
    for condition in ("no positions, no mask", "RoPE, no mask", "position ids + c"):
        assert condition in text
    assert "fail" not in set(verdicts.verdict)
    assert page.locator("#equivariance-verdicts tbody tr").count() == len(verdicts) + 1


def test_a_head_before_and_after_a_permutation(page, served):
    url, run = served
    page.goto(f"{url}/equivariance?run={run.id}")
    first = figure(page, "equivariance-before", title_contains="L0H0, no positions, no mask")
    before, after, perm = stored(run, "no positions, no mask", 0, 0, 0, 0)
    np.testing.assert_allclose(as_array(first["data"][0]["z"]), before, atol=1e-6)
    raw = figure(page, "equivariance-after", title_contains="L0H0")
    np.testing.assert_allclose(as_array(raw["data"][0]["z"]), after, atol=1e-6)
    back = figure(page, "equivariance-back", title_contains="L0H0")
    # equivariant: permuting rows and columns back recovers the original pattern ...
    np.testing.assert_allclose(as_array(back["data"][0]["z"]), before, atol=1e-5)
    # ... while the pattern as computed on PX is not the original one
    assert np.abs(after - before).max() > 1e-3
    assert "equivariant" in page.inner_text("#equivariance-view-stats")
    assert str(perm.tolist()).replace(",", "") in page.inner_text("#equivariance-permutation")

    choose(page, "equivariance-condition", "no positions, causal mask")
    choose(page, "equivariance-seed", "1")
    choose(page, "equivariance-layer", "1")
    choose(page, "equivariance-head", "3")
    fig = figure(page, "equivariance-back", title_contains="L1H3, no positions, causal mask")
    before, after, perm = stored(run, "no positions, causal mask", 0, 1, 3, 1)
    inverse = np.argsort(perm)
    np.testing.assert_allclose(as_array(fig["data"][0]["z"]), after[inverse][:, inverse],
                               atol=1e-6)
    assert np.abs(after[inverse][:, inverse] - before).max() > 1e-3  # the mask broke it
    page.wait_for_function("() => document.querySelector('#equivariance-view-stats')"
                           ".innerText.includes('not equivariant')")


def test_worked_example_step_by_step(page, served):
    url, run = served
    page.goto(f"{url}/equivariance?run={run.id}")
    page.wait_for_selector("#equivariance-worked-scores")
    ex = worked_example()

    def cells(key):
        rows = page.locator(f"#equivariance-worked-{key} tbody tr")
        return [[float(c) for c in rows.nth(i).locator("td").all_inner_texts()]
                for i in range(rows.count())]

    assert cells("scores") == [[3, 2, 2, 3], [8, 12, 8, 12], [7, 11, 8, 11], [6, 11, 6, 10]]
    assert cells("weights")[3] == [0.0333, 0.5978, 0.0333, 0.3356]
    assert cells("output")[3] == [0.5022, 2.9, 1.4022]
    assert cells("causal-weights")[2] == [0.0778, 0.7836, 0.1386, 0]
    assert cells("causal-output")[:2] == [[3, 1, 3], [0.271, 2.8193, 1.1807]]
    np.testing.assert_allclose(cells("x"), ex.x.numpy())
    np.testing.assert_allclose(cells("shuffled-output"), np.round(ex.output[[3, 1, 0, 2]], 4))


def test_equivariance_figures_and_tables_can_be_exported(page, served):
    url, run = served
    page.goto(f"{url}/equivariance?run={run.id}")
    figure(page, "equivariance-before", title_contains="L0H0")
    offers_exports(page, "equivariance-before", run.id)
