"""The Live page: a typed prompt is recorded by the server and its heads drawn (on the tiny
Llama, a local model folder the dashboard offers with ``--live-model``). The time from the
click on Record to the figure is kept in the JUnit report; ``benchmarks/live.py`` measures
it."""

from __future__ import annotations

import time

import pytest

from tests.browser.conftest import as_array, choose, figure, serve
from workbench.harness import live
from workbench.models.load import load_model
from workbench.recording.reader import Recording
from workbench.recording.writer import record
from workbench.store.runs import RunStore

PROMPT = "The cat sat on the mat. The cat sat on the mat again."
WAIT = 600.0
"""The longest the test waits for a figure: a bound on a hang, not a speed."""


@pytest.fixture
def live_store(tmp_path, llama_folder):
    """A store with one recording of the tiny Llama folder."""
    runs = tmp_path / "runs"
    model = load_model(str(llama_folder))
    with RunStore(runs).start("record", model.info, {"source": "text"}) as run:
        record(model, [live.Prompt(text="an earlier prompt")], run.dir / "recording")
    return runs, model


@pytest.fixture
def live_url(live_store, llama_folder):
    """The dashboard over that store, offering the tiny Llama folder on the Live page
    (requested before ``page``, so it stops after the page has closed and no request of
    the page is left without an answer)."""
    proc, url = serve(live_store[0], "--live-model", str(llama_folder))
    yield url
    proc.kill()
    proc.wait()


def test_a_typed_prompt_is_recorded_and_its_best_head_drawn(live_url, page, live_store,
                                                            llama_folder, record_property):
    runs, model = live_store
    url = live_url
    page.goto(f"{url}/live")
    page.wait_for_selector("#live-text")
    choose(page, "live-model", str(llama_folder))
    page.fill("#live-text", PROMPT)
    start = time.perf_counter()
    page.click("#live-submit")
    fig = figure(page, "live-pattern", title_contains="layer", timeout=WAIT)
    record_property("submit_to_figure_s", round(time.perf_counter() - start, 2))  # --junitxml

    run_id = page.inner_text("#live-run-link")
    run = RunStore(runs).get(run_id)
    assert (run.experiment, run.config["source"], run.status) == ("record", "live",
                                                                  "complete")
    rec = Recording.open(run.path)
    n = len(model.encode(live.Prompt(text=PROMPT))[0])
    assert rec.length(0) == n
    layer, head = live.opening_head(live.pattern_scores(rec))
    assert f"layer {layer}, head {head}" in fig["layout"]["title"]["text"]
    z = as_array(fig["data"][0]["z"])
    assert z.shape == (n, n)
    assert z == pytest.approx(rec.pattern(0, layer, head).astype(float), abs=1e-3)
    row = figure(page, "live-row", title_contains=f"query {n - 1} ")
    assert as_array(row["data"][0]["y"]).sum() == pytest.approx(1.0, abs=1e-2)
    href = page.get_attribute("#live-recording-link", "href")
    assert href.endswith(f"/recording?run={run_id}")

    # again, the model now loaded: the time a reader waits for a second prompt (the
    # pattern and the row are drawn together; the row's title names the new last query)
    second = "Another prompt, and the model is already loaded."
    n2 = len(model.encode(live.Prompt(text=second))[0])
    assert n2 != n
    page.fill("#live-text", second)
    start = time.perf_counter()
    page.click("#live-submit")
    figure(page, "live-row", title_contains=f"query {n2 - 1} ", timeout=WAIT)
    record_property("warm_submit_to_figure_s", round(time.perf_counter() - start, 2))
    again = RunStore(runs).get(page.inner_text("#live-run-link"))
    assert again.status == "complete" and again.id != run_id
