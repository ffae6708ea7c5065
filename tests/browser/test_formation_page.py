"""The formation page in a real browser: curves with the window shaded, every head over
training, and a checkpoint slider that changes the pattern shown."""

from __future__ import annotations

import numpy as np
import pytest

from tests.browser.conftest import as_array, choose, figure, offers_exports, serve, stop
from workbench.harness.experiment import run_experiment
from workbench.views.style import pattern_from_rows

TEXT = ("A module is a file containing Python definitions and statements. The module name is "
        "the file name without the suffix. Return the number of items in the container.")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    runs = tmp_path_factory.mktemp("runs")
    text = tmp_path_factory.mktemp("text") / "text.txt"
    text.write_text("\n\n".join(f"{i}: {TEXT}" for i in range(40)))
    overrides = {"sources": (), "text_files": (str(text),), "vocab_size": 320, "d_model": 16,
                 "n_heads": 2, "n_ctx": 40, "steps": 8, "checkpoint_every": 4,
                 "batch_size": 4, "warmup_steps": 2, "lr": 0.03, "heldout_windows": 4,
                 "icl_early": 5, "icl_late": 36, "icl_band": 2, "n_repeat_prompts": 3,
                 "repeat_len": 8, "pattern_len": 6, "n_boot": 20, "composition": False}
    run = run_experiment("induction-formation", None, overrides, runs_dir=runs)
    proc, url = serve(runs)
    yield url, run
    stop(proc)


def test_curves_and_head_scores_carry_the_run(page, served):
    url, run = served
    page.goto(f"{url}/formation?run={run.id}")
    fig = figure(page, "formation-curves", title_contains="against tokens seen · L2")
    curve = run.table("training_curve")
    for model in ("L1", "L2"):
        trace = next(t for t in fig["data"] if t["name"] == f"{model} held-out loss")
        want = curve[curve.model == model].sort_values("step")
        np.testing.assert_allclose(as_array(trace["x"]), want.tokens)
        np.testing.assert_allclose(as_array(trace["y"]), want.heldout_loss, rtol=1e-6)
        icl = next(t for t in fig["data"] if t["name"] == f"{model} ICL score")
        np.testing.assert_allclose(as_array(icl["y"]), want.icl_score, rtol=1e-6)
    heads = figure(page, "formation-heads", title_contains="over training · L2")
    scores = run.table("head_scores")
    line = next(t for t in heads["data"] if t["name"] == "L1H1 induction")
    want = scores[(scores.model == "L2") & (scores.metric == "induction") & (scores.layer == 1)
                  & (scores["head"] == 1)].sort_values("step")
    np.testing.assert_allclose(as_array(line["y"]), want.score, rtol=1e-6)
    assert len([t for t in heads["data"] if t["name"].endswith(" previous_token")]) == 4
    # the line under the controls is read from the phase_change table, not the summary
    phase = run.table("phase_change").set_index("model").loc["L2"]
    summary = page.locator("#formation-summary").inner_text()
    before, after = ((phase.induction_before, phase.induction_after) if phase.detected
                     else (phase.induction_initial, phase.induction_final))
    assert summary.startswith("L2: ") and f"{before:.2f} to {after:.2f}" in summary
    assert f"{phase.second_repeat_final:.2f} nats" in summary
    choose(page, "formation-model", "L1")
    figure(page, "formation-heads", title_contains="over training · L1")


def test_the_slider_moves_through_checkpoints(page, served):
    url, run = served
    page.goto(f"{url}/formation?run={run.id}")
    choose(page, "formation-head", "L1H0")
    first = figure(page, "formation-pattern", title_contains="L2 L1H0 at step 0")
    patterns = run.table("checkpoint_patterns")
    n = len(run.table("pattern_tokens"))

    def stored(step):
        one = patterns[(patterns.model == "L2") & (patterns.step == step)
                       & (patterns.layer == 1) & (patterns["head"] == 0)]
        return pattern_from_rows(one, n)

    np.testing.assert_allclose(as_array(first["data"][0]["z"]), stored(0), atol=1e-6)
    page.focus("#formation-step [role=slider]")
    page.keyboard.press("End")
    last = figure(page, "formation-pattern", title_contains="L2 L1H0 at step 8")
    z = as_array(last["data"][0]["z"])
    np.testing.assert_allclose(z, stored(8), atol=1e-6)
    assert not np.allclose(z, stored(0), atol=1e-4)  # training moved the pattern
    page.keyboard.press("ArrowLeft")
    figure(page, "formation-pattern", title_contains="L2 L1H0 at step 4")


def test_formation_figures_and_tables_can_be_exported(page, served):
    url, run = served
    page.goto(f"{url}/formation?run={run.id}")
    figure(page, "formation-curves", title_contains="against tokens seen")
    offers_exports(page, "formation-curves", run.id)
