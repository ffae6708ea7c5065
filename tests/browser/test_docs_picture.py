"""The picture of the dashboard that the README and the getting-started page show, taken
from a served store so that it stays the dashboard as it is: the Heads page of a
previous-token-heads run (its demo config) on smollm2, saved to docs/images/dashboard.png."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.browser.conftest import figure, serve, stop
from workbench.harness.experiment import get, run_experiment
from workbench.models.load import load_model

PICTURE = Path(__file__).resolve().parents[2] / "docs" / "images" / "dashboard.png"
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.mark.integration
def test_the_heads_page_is_pictured_for_the_docs(page, tmp_path):
    runs = tmp_path / "runs"
    demo = get("previous-token-heads").named_config("demo")
    run = run_experiment("previous-token-heads", load_model("smollm2"), demo, runs_dir=runs)
    proc, url = serve(runs)
    try:
        page.goto(f"{url}/heads?run={run.id}")
        figure(page, "heads-heatmap", title_contains="previous_token")
        figure(page, "heads-example")
        page.wait_for_selector("#heads-table td")
        page.wait_for_timeout(500)  # Plotly's transitions end before the picture is taken
        # the header names the store: the reader's default, not this test's temporary folder
        page.evaluate("document.querySelector('.wb-runs-dir').textContent = 'data/runs'")
        PICTURE.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(PICTURE))
    finally:
        stop(proc)
    data = PICTURE.read_bytes()
    assert data.startswith(PNG) and len(data) > 20_000
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (width, height) == (1500, 1100)  # the viewport of the `page` fixture
