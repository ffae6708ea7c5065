"""The Recording page on a ``qk`` recording in a real browser: the weights it draws are the
float32 dense recording's, rebuilt from the stored queries, keys and row log-sum-exps."""

from __future__ import annotations

import numpy as np
import pytest

from tests.browser.conftest import as_array, choose, figure, serve, stop
from workbench.inputs.prompts import Prompt
from workbench.recording.reader import Recording
from workbench.recording.writer import record
from workbench.store.runs import RunStore

TEXTS = ["the cat sat on the mat", "a quick brown fox jumps over the lazy dog"]


@pytest.fixture(scope="module")
def served(tmp_path_factory, llama):
    runs = tmp_path_factory.mktemp("runs")
    store = RunStore(runs)
    prompts = [Prompt(text=t) for t in TEXTS]
    with store.start("record", llama.info, {"source": "test", "patterns": "qk"}) as run:
        record(llama, prompts, run.dir / "recording", patterns="qk")
    dense = record(llama, prompts, tmp_path_factory.mktemp("dense") / "recording",
                   patterns="dense", store_dtype="float32")
    proc, url = serve(runs)
    yield url, store.get(run.id), dense
    stop(proc)


def test_the_recording_page_draws_a_qk_recordings_exact_weights(page, served):
    url, run, dense = served
    rec = Recording.open(run.path)
    assert rec.patterns == "qk"
    page.goto(f"{url}/recording?run={run.id}")
    figure(page, "recording-pattern", title_contains="layer ")
    choose(page, "recording-layer", "1")
    choose(page, "recording-head", "2")
    fig = figure(page, "recording-pattern", title_contains="layer 1, head 2")
    np.testing.assert_allclose(as_array(fig["data"][0]["z"]), dense.pattern(0, 1, 2), atol=1e-6)
