"""gemma3's global layers marked on the Live page's head scores and the Recording page's
grid of every head (a tiny Gemma 3: layer 0 slides, layer 1 is global)."""

from __future__ import annotations

import pytest

from tests import tiny
from tests.architectures.families import build
from tests.browser.conftest import figure, serve, stop
from workbench.inputs.prompts import Prompt
from workbench.recording.writer import record
from workbench.store.runs import RunStore


@pytest.fixture(scope="module")
def served(tmp_path_factory, tokenizer):
    model = tiny.wrap(build("gemma-3", len(tokenizer)), tokenizer, "tiny-gemma3")
    # the family's config: layer_types ["sliding_attention", "full_attention"]
    assert model.info.layer_types == ("sliding", "global")
    runs = tmp_path_factory.mktemp("runs")
    with RunStore(runs).start("record", model.info, {"source": "test"}) as run:
        record(model, [Prompt(text="the cat sat on the mat")], run.dir / "recording")
    proc, url = serve(runs)
    yield url, run.id
    stop(proc)


def layer_axis(fig: dict) -> list[str]:
    """The labels the figure's layer axis shows, top to bottom."""
    return [str(t) for t in fig["layout"]["yaxis"].get("ticktext", [])]


def test_the_live_pages_head_scores_mark_the_global_layer(page, served):
    url, run_id = served
    page.goto(f"{url}/live?run={run_id}")
    fig = figure(page, "live-scores", title_contains="click a head")
    assert layer_axis(fig) == ["0", "1 global"]


def test_the_recording_grid_marks_the_global_layer(page, served):
    url, run_id = served
    page.goto(f"{url}/recording?run={run_id}")
    fig = figure(page, "recording-grid", title_contains="all heads")
    assert layer_axis(fig) == ["0", "1 global"]
