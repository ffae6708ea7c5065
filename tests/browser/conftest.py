"""A dashboard served from a subprocess, and headless Chromium (Debian's) to drive it."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pytest

CHROMIUM = os.environ.get("WORKBENCH_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run",
                 "--disable-quic"]
WAIT = 300.0
"""The longest a test waits for a state of a page (a figure drawn, a table filled): a bound
on a hang, not a speed, so that a loaded machine is slow, not failing."""
START_WAIT = 300.0
"""The longest a test waits for a served dashboard to answer."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(runs_dir, *options: str) -> tuple[subprocess.Popen, str]:
    """Start ``workbench dashboard`` (with more ``options``) on a free port; return the
    process and its URL."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "workbench", "--quiet", "dashboard", "--runs", str(runs_dir),
         "--port", str(port), *options], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + START_WAIT
    while time.time() < deadline:
        try:
            urllib.request.urlopen(url, timeout=1)
            return proc, url
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError(f"dashboard exited: {proc.stdout.read()}") from None
            time.sleep(0.3)
    proc.kill()
    raise RuntimeError(f"dashboard did not start within {START_WAIT:g} s")


def stop(proc: subprocess.Popen, grace: float = 60) -> None:
    """Stop a served dashboard: SIGTERM, and SIGKILL if it has not exited within ``grace``
    seconds (on shared cores a clean exit can take longer than on an idle machine)."""
    proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="session")
def browser():
    if not shutil.which(CHROMIUM) and not os.path.exists(CHROMIUM):
        pytest.fail(f"Chromium not found at {CHROMIUM} (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1500, "height": 1100})
    context.set_default_timeout(WAIT * 1000)  # every wait of the page is bounded, not timed
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    # Dash logs a callback that failed on the server (an HTTP 500) to the console
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    yield page
    context.close()
    assert not errors, f"JavaScript errors in the page: {errors}"


def choose(page, dropdown_id: str, option: str) -> None:
    """Pick ``option`` in a Dash dropdown by clicking it open and clicking the option."""
    page.click(f"#{dropdown_id}")
    page.locator("[role=listbox] [role=option]").filter(
        has=page.get_by_text(option, exact=True)).first.click()


def figure(page, graph_id: str, *, title_contains: str = "", timeout: float = WAIT) -> dict:
    """The Plotly figure (data and layout) rendered in ``graph_id``, once its title matches."""
    script = """([id, want]) => {
        const el = document.querySelector(`#${id} .js-plotly-plot`);
        if (!el || !el.data || !el.layout) return null;
        // a title is wrapped onto lines to fit its figure: read it as one line
        const title = ((el.layout.title && el.layout.title.text) || "").replaceAll("<br>", " ");
        if (!title.includes(want)) return null;
        return {data: el.data, layout: el.layout};
    }"""
    handle = page.wait_for_function(script, arg=[graph_id, title_contains],
                                    timeout=timeout * 1000)
    return handle.json_value()


def sink_head(rec, prompt: int = 0) -> tuple[int, int]:
    """The (layer, head) whose dense pattern puts the most mean weight on the first key
    over every query but the first, found from the recording's full patterns."""
    mass = np.array([[rec.pattern(prompt, layer, head)[1:, 0].mean()
                      for head in range(rec.n_heads)] for layer in range(rec.n_layers)])
    layer, head = np.unravel_index(int(np.argmax(mass)), mass.shape)
    return int(layer), int(head)


def as_array(value):
    """A figure array as the browser holds it: a list, or Plotly's typed-array encoding."""
    import base64

    if isinstance(value, dict) and "bdata" in value:
        array = np.frombuffer(base64.b64decode(value["bdata"]), dtype=value["dtype"])
        shape = value.get("shape")
        if shape:
            dims = [int(d) for d in str(shape).split(",")] if isinstance(shape, str) else shape
            array = array.reshape(dims)
        return array.astype(float)
    return np.array(value, dtype=float)


def download(page, selector: str) -> tuple[str, bytes]:
    """Click ``selector`` and return the file the browser downloads: its name and bytes."""
    with page.expect_download() as info:
        page.click(selector)
    saved = info.value
    with open(saved.path(), "rb") as f:
        return saved.suggested_filename, f.read()


def offers_exports(page, graph_id: str, run_id: str) -> None:
    """Assert that ``graph_id`` saves an SVG named after the run and that the page lists
    the run's tables to download."""
    name, body = download(page, f"#{graph_id}-panel .wb-export-button:text-is('SVG')")
    assert name == f"{run_id}-{graph_id}.svg" and body.lstrip().startswith(b"<svg")
    page.wait_for_selector(".wb-download button:text-is('Parquet')")
    assert page.locator(".wb-download button:text-is('CSV')").count() == 1


def class_marks(page, graph_id: str, *, name: str, timeout: float = WAIT) -> set[tuple[int, int]]:
    """The ``(layer, head)`` cells marked on a heatmap by its trace ``name`` (a head class at
    a rate, :mod:`dashboards.components.head_classes`), once that trace is drawn."""
    script = """([id, name]) => {
        const el = document.querySelector(`#${id} .js-plotly-plot`);
        const marks = el && el.data && el.data.find(t => t.name === name);
        return marks ? {x: marks.x, y: marks.y} : null;
    }"""
    handle = page.wait_for_function(script, arg=[graph_id, name], timeout=timeout * 1000)
    cells = handle.json_value()
    return {(int(y), int(x)) for x, y in zip(as_array(cells["x"]), as_array(cells["y"]),
                                             strict=True)}
