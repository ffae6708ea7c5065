"""A run dropdown in a real browser: it opens on the newest runs, and typing into it finds
an older run the first options leave out, which then opens."""

from __future__ import annotations

import time

import pytest

from dashboards.components.controls import MAX_RUN_CHOICES
from tests.browser.conftest import figure, serve, stop
from tests.tiny import fake_info
from workbench.inputs.prompts import Prompt
from workbench.recording.writer import record
from workbench.store.runs import RunStore


@pytest.fixture(scope="module")
def served(tmp_path_factory, llama):
    """A store whose one real recording is older than ``MAX_RUN_CHOICES + 1`` recordings
    of other models (complete runs with no recording in them)."""
    runs = tmp_path_factory.mktemp("runs")
    store = RunStore(runs)
    with store.start("record", llama.info, {"source": "test"}) as run:
        record(llama, [Prompt(text="the cat sat on the mat")], run.dir / "recording")
    time.sleep(1.1)  # runs are ordered by their start, to the second: the others are newer
    for i in range(MAX_RUN_CHOICES + 1):
        with store.start("record", fake_info(f"other-{i:02d}"), {"source": "test"}):
            pass
    proc, url = serve(runs)
    yield url, run.id
    stop(proc)


def test_typing_finds_an_older_run_and_opens_it(page, served):
    url, old = served
    page.goto(f"{url}/recording")
    page.wait_for_selector("#recording-run")
    page.click("#recording-run")
    opened = page.locator(".dash-dropdown-content")  # the open dropdown's popover
    options = opened.locator("[role=option]")
    options.first.wait_for()
    assert not options.filter(has_text=old[-4:]).count()  # not among the newest
    # 12 runs: the newest 10 offered, the older two (the recording and other-00) searched
    assert options.filter(has_text="type to search 2 older runs").count() == 1
    # filled into the popover's own search box as one input event: typed a key at a time
    # (each key its own search), a loaded machine once left no option matching for 300 s
    opened.locator("input[type=search]").fill("tiny")
    found = options.filter(has_text=old[-4:])
    found.first.wait_for()
    found.first.click()
    fig = figure(page, "recording-pattern", title_contains="layer")
    assert fig["data"][0]["z"]
