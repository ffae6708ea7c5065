"""How a page and ``workbench runs`` scale with the number of runs in the store.

One run of ``--experiment`` is made on ``--model``; the store is then grown to ``--runs``
runs by copying its folder under new run ids (tables hard-linked, ``run.json`` rewritten
with the new id, so every copy is a complete, verifiable run). At 1 run and at
``--runs`` runs it measures:

- ``get_ms``: :meth:`RunStore.get` of one run by its whole id;
- ``page_ms``: the server's work for opening the experiment's dashboard page on one run,
  as a browser asks for it: the page's layout for ``?run=<id>``, then every callback of
  the page posted with that run chosen (Flask's test client, no network; the median of
  ``--repeats``). A browser adds its own drawing time, which does not grow with the store;
- ``runs_cpu_s``: CPU seconds (user + system) of ``workbench runs`` listing the store;
- with ``--browser``, ``browser_ms <page>``: headless Chromium (``/usr/bin/chromium``, or
  ``$WORKBENCH_CHROMIUM``) opening every dashboard page, from navigation to network idle
  (no request for 500 ms, the same in both stores), served by ``workbench dashboard``; the
  run's own page opens on the run (``?run=``), the others on the store as it is.

It prints one line per measure and size, and the ratio of the large store to the one-run
store. ``--smoke MODEL_FOLDER`` grows a store of a few runs from the tests' tiny model, so
that a benchmark that no longer runs fails the tests (``tests/unit/test_benchmarks.py``).

Usage:
    python benchmarks/store_scale.py [--model minilm] [--runs 10000] [--repeats 3] [--browser]
    python benchmarks/store_scale.py --smoke MODEL_FOLDER
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CONFIGS = {
    "previous-token-heads": {"n_prompts": 4, "n_repeated": 4, "n_tokens": 32, "seq_len": 8,
                             "n_boot": 20},
}
"""A small configuration of each experiment the benchmark can copy."""


def make_run(store: Path, experiment: str, model: str) -> str:
    """One complete run of ``experiment`` on ``model`` in ``store``; its id."""
    from workbench.harness.experiment import run_experiment
    from workbench.models.load import load_model

    return run_experiment(experiment, load_model(model), CONFIGS[experiment],
                          runs_dir=store).id


def grow(store: Path, run_id: str, total: int) -> None:
    """Copy run ``run_id`` until ``store`` holds ``total`` runs: each copy's folder and
    ``run.json`` carry a new id (its last four hex digits), its tables hard-linked."""
    base = store / run_id
    meta = json.loads((base / "run.json").read_text())
    stem = run_id[:-4]
    made = 1
    for n in range(1 << 16):
        if made >= total:
            return
        new_id = f"{stem}{n:04x}"
        if new_id == run_id:
            continue
        folder = store / new_id
        shutil.copytree(base, folder, copy_function=os.link)
        (folder / "run.json").unlink()  # a link: the copy gets its own record
        (folder / "run.json").write_text(json.dumps({**meta, "run_id": new_id}))
        made += 1
    raise SystemExit(f"error: at most {1 << 16} copies of one run id")


def _body(app, key: str, values: dict[str, object]) -> dict:
    """What a browser posts to run callback ``key``, ``values`` (``id.property``) given."""
    from dash._utils import split_callback_id

    spec = app.callback_map[key]

    def entry(item: dict) -> dict:
        return {**item, "value": values.get(f"{item['id']}.{item['property']}")}

    inputs = [entry(i) for i in spec["inputs"]]
    return {"output": key, "outputs": split_callback_id(key), "inputs": inputs,
            "state": [entry(s) for s in spec["state"]],
            "changedPropIds": [f"{inputs[0]['id']}.{inputs[0]['property']}"]}


def page_ms(store: Path, run_id: str, path: str, repeats: int) -> float:
    """Median milliseconds of the server's work for opening page ``path`` on ``run_id``."""
    from dashboards.app import create_app

    app = create_app(store)
    client = app.server.test_client()
    assert client.get("/").status_code == 200  # registers the callbacks
    router = next(k for k in app.callback_map if "_pages_content.children" in k)
    bodies = [_body(app, router, {"_pages_location.pathname": path,
                                  "_pages_location.search": f"?run={run_id}"})]
    prefix = path.strip("/")
    chosen = {f"{prefix}-run.value": run_id}
    bodies += [_body(app, key, chosen) for key, spec in app.callback_map.items()
               if key.strip(".").startswith(prefix + "-") and "callback" in spec
               and all(isinstance(i["id"], str) for i in spec["inputs"] + spec["state"])]
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for body in bodies:
            status = client.post("/_dash-update-component", json=body).status_code
            assert status in (200, 204), (body["output"], status)
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def runs_cpu_s(store: Path) -> float:
    """CPU seconds of ``workbench runs`` listing ``store``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-m", "workbench", "--quiet", "runs", "--out", str(store)],
                   check=True, capture_output=True, timeout=3600)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def get_ms(store: Path, run_id: str, repeats: int) -> float:
    from workbench.store.runs import RunStore

    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        RunStore(store).get(run_id)
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def _serve(store: Path) -> tuple[subprocess.Popen, str]:
    """``workbench dashboard`` on ``store`` and a free port, once it answers."""
    import socket
    import urllib.request

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "workbench", "--quiet", "dashboard",
                             "--runs", str(store), "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(3000):
        try:
            urllib.request.urlopen(url, timeout=1)
            return proc, url
        except OSError:
            if proc.poll() is not None:
                raise SystemExit("error: the dashboard exited") from None
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("error: the dashboard did not answer within 5 minutes")


def browser_ms(store: Path, run_id: str, run_page: str, repeats: int,
               only: tuple[str, ...] = ()) -> dict[str, float]:
    """Median milliseconds of headless Chromium opening each dashboard page (those of
    ``only``, if given), from navigation to network idle, by page."""
    from playwright.sync_api import sync_playwright

    from workbench.views.pages import PAGES

    chromium = os.environ.get("WORKBENCH_CHROMIUM", "/usr/bin/chromium")
    proc, url = _serve(store)
    times: dict[str, float] = {}
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium,
                                         args=["--no-sandbox", "--disable-gpu"])
            page = browser.new_page()
            page.goto(url, wait_until="networkidle")  # the app's scripts, once
            for entry in PAGES:
                if only and entry.path not in only:
                    continue
                target = url + entry.path + (f"?run={run_id}" if entry.path == run_page else "")
                took = []
                for _ in range(repeats):
                    start = time.perf_counter()
                    page.goto(target, wait_until="networkidle")
                    took.append(time.perf_counter() - start)
                times[f"browser_ms {entry.path}"] = 1000 * statistics.median(took)
            browser.close()
    finally:
        proc.terminate()
        proc.wait(60)
    return times


def measure(store: Path, run_id: str, path: str, repeats: int, browser: bool = False,
            only: tuple[str, ...] = ()) -> dict[str, float]:
    found = {"get_ms": get_ms(store, run_id, repeats),
             "page_ms": page_ms(store, run_id, path, repeats),
             "runs_cpu_s": runs_cpu_s(store)}
    if browser:
        found.update(browser_ms(store, run_id, path, repeats, only))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--experiment", default="previous-token-heads", choices=sorted(CONFIGS))
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--browser", action="store_true",
                        help="also time every page in headless Chromium")
    parser.add_argument("--smoke", metavar="MODEL_FOLDER")
    args = parser.parse_args()
    if args.smoke:
        args.model, args.runs, args.repeats, args.browser = args.smoke, 20, 1, True
    if not 2 <= args.runs <= 1 << 16:
        parser.error(f"--runs must be 2 .. {1 << 16}, got {args.runs}")

    from workbench.views.pages import page_for

    path = page_for(args.experiment)
    only = (path, "/") if args.smoke else ()  # a smoke run's browser opens two pages
    with tempfile.TemporaryDirectory() as tmp:  # removing a large store takes a while
        store = Path(tmp) / "runs"
        run_id = make_run(store, args.experiment, args.model)
        one = measure(store, run_id, path, args.repeats, args.browser, only)
        grow(store, run_id, args.runs)
        many = measure(store, run_id, path, args.repeats, args.browser, only)
        print(f"{args.experiment} on {args.model}, page {path}, load average "
              f"{os.getloadavg()[0]:.2f}")
        for name in one:
            print(f"{name:>24}: 1 run {one[name]:9.2f}   {args.runs} runs {many[name]:9.2f}"
                  f"   ratio {many[name] / one[name]:6.2f}", flush=True)


if __name__ == "__main__":
    main()
