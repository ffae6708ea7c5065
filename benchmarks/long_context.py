"""Long contexts: recording 8,192 tokens of smollm2 in bounded memory and disk, and viewing it.

Each measurement runs in its own subprocess, so that its peak RSS is its own:

- ``long``: record one 8,192-token prompt (smollm2's context; consecutive prose of the
  Python documentation, :func:`workbench.inputs.corpus.python_docs`, no repetition) with
  ``topk`` patterns: peak RSS (target under 6 GiB), bytes on disk (target under 300 MB:
  patterns; the residual stream is recorded too and counted apart), tokens/s.
- ``reduce8k``: pattern reductions (first-token and previous-token scores of every head)
  on the same 8,192 tokens: time and peak RSS.
- ``dense2k`` / ``topk2k``: one 2,048-token prompt recorded dense and as topk: bytes, time.
- ``many100`` / ``many1000``: 100 and 1,000 prompts of 128 tokens (the corpus repeated
  when it runs out): peak RSS, which should be flat in the number of prompts.
- ``view``: the long-context page of the dashboard on the 8,192-token recording, in
  Chromium: time from the page request to the rendered overview (target under 2 s), from
  a change of pooling on the open page to the redrawn overview, and from a box drawn on
  the overview to the rendered 256-token window.

Usage:
    python benchmarks/long_context.py [--parts long,dense2k,...] [--json]
    python benchmarks/long_context.py --parts long --keep /tmp/wb-8k   # keep the 8k recording
    python benchmarks/long_context.py --parts view --keep /tmp/wb-8k   # then view it again
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GiB, MB = 2**30, 10**6


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def _prompts(model, n_prompts: int, n_tokens: int):
    from workbench.inputs.corpus import python_docs, token_chunks

    docs = python_docs()
    stream = len(model.tokenizer("\n\n".join(docs), add_special_tokens=False)["input_ids"])
    repeats = -(-n_prompts * n_tokens // stream) + 1  # the corpus repeated when too short
    return token_chunks(model, docs * repeats, n_chunks=n_prompts, n_tokens=n_tokens), repeats


def _record(out: Path, n_prompts: int, n_tokens: int, patterns: str) -> dict:
    from workbench.models.load import load_model
    from workbench.recording.record import record
    from workbench.store.runs import RunStore

    model = load_model("smollm2")
    prompts, repeats = _prompts(model, n_prompts, n_tokens)
    store = RunStore(out)
    rss_before = peak_rss_mib()
    t0 = time.perf_counter()
    with store.start("record", model.info.to_dict(), {"patterns": patterns}) as run:
        rec = record(model, prompts, run.dir / "recording", patterns=patterns,
                     max_batch_tokens=max(2048, n_tokens))
    seconds = time.perf_counter() - t0
    folder = store.get(run.final).path / "recording" / "recording.zarr"
    resid = sum(_bytes(p) for p in folder.glob("resid"))
    return {"prompts": n_prompts, "tokens": n_tokens, "patterns": rec.patterns,
            "corpus_repeats": repeats, "seconds": seconds,
            "tok_s": n_prompts * n_tokens / seconds,
            "pattern_mb": (_bytes(folder) - resid) / MB, "resid_mb": resid / MB,
            "peak_rss_before_gib": rss_before / 1024, "peak_rss_gib": peak_rss_mib() / 1024,
            "run": run.final.name}


def part_long(args: argparse.Namespace) -> dict:
    return _record(Path(args.store), 1, 8192, "topk")


def part_reduce8k(args: argparse.Namespace) -> dict:
    """First-token and previous-token scores of every head on the same 8,192 tokens."""
    from workbench.models.load import load_model
    from workbench.recording.reductions import reduce_patterns
    from workbench.scores import patterns

    model = load_model("smollm2")
    prompts, _ = _prompts(model, 1, 8192)
    t0 = time.perf_counter()
    scores = reduce_patterns(model, prompts, {"first_token": patterns.first_token,
                                              "previous_token": patterns.previous_token},
                             max_batch_tokens=8192)
    return {"seconds": time.perf_counter() - t0, "rows": len(scores),
            "peak_rss_gib": peak_rss_mib() / 1024}


RECORDINGS = {"dense2k": (1, 2048, "dense"), "topk2k": (1, 2048, "topk"),
              "many100": (100, 128, "auto"), "many1000": (1000, 128, "auto")}
"""Recording parts: ``(prompts, tokens per prompt, pattern storage)``, each in a fresh store."""


def part_recording(args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory(dir=args.store) as tmp:
        return _record(Path(tmp), *RECORDINGS[args.part])


def part_view(args: argparse.Namespace) -> dict:
    """The long-context page in Chromium on the 8k recording ``long`` left in the store."""
    from playwright.sync_api import sync_playwright

    runs = sorted(p.name for p in Path(args.store).iterdir() if (p / "run.json").is_file())
    port = "8093"
    server = subprocess.Popen(
        [sys.executable, "-m", "workbench", "--quiet", "dashboard", "--runs", args.store,
         "--port", port], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_up(f"http://127.0.0.1:{port}/")
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path="/usr/bin/chromium",
                                         args=["--no-sandbox", "--disable-gpu"])
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            t0 = time.perf_counter()
            page.goto(f"http://127.0.0.1:{port}/long-context?run={runs[-1]}")
            page.wait_for_function(OVERVIEW_DRAWN, timeout=60_000)
            overview = time.perf_counter() - t0
            t0 = time.perf_counter()  # the page open: another overview, sum-pooled
            page.get_by_label("sum").check()
            page.wait_for_function(OVERVIEW_DRAWN.replace("'pooling'", "'sum pooling'"),
                                   timeout=60_000)
            redraw = time.perf_counter() - t0
            t0 = time.perf_counter()  # a box drawn on the overview: keys 3840.., queries 4096..
            page.evaluate(BRUSH)
            page.wait_for_function(WINDOW_DRAWN, timeout=60_000)
            zoom = time.perf_counter() - t0
            browser.close()
    finally:
        server.terminate()
        server.wait(timeout=30)
    return {"overview_s": overview, "overview_redraw_s": redraw, "zoom_256_s": zoom}


BRUSH = """() => Plotly.relayout(document.querySelector('#long-context-overview .js-plotly-plot'),
    {'xaxis.range[0]': 3840, 'xaxis.range[1]': 4096,
     'yaxis.range[0]': 4352, 'yaxis.range[1]': 4096})"""
OVERVIEW_DRAWN = """() => {
    const el = document.querySelector('#long-context-overview .js-plotly-plot');
    return el && el.layout && el.layout.title && el.layout.title.text.includes('pooling');
}"""
WINDOW_DRAWN = """() => {
    const el = document.querySelector('#long-context-window .js-plotly-plot');
    return el && el.layout && el.layout.title && el.layout.title.text.includes('queries 4096');
}"""


def _wait_up(url: str) -> None:
    import urllib.request

    for _ in range(240):
        try:
            urllib.request.urlopen(url, timeout=1)
            return
        except OSError:  # the server is still starting
            time.sleep(0.5)
    raise RuntimeError(f"the dashboard did not start at {url}")


PARTS = {"long": part_long, "reduce8k": part_reduce8k, **dict.fromkeys(RECORDINGS, part_recording),
         "view": part_view}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=PARTS, help=argparse.SUPPRESS)
    parser.add_argument("--store", help=argparse.SUPPRESS)
    parser.add_argument("--parts", default=",".join(PARTS),
                        help="comma-separated parts to run (default all)")
    parser.add_argument("--keep", metavar="DIR", help="run in this store and keep it (so "
                        "`--parts view --keep DIR` views the 8k recording `long` left there)")
    parser.add_argument("--json", action="store_true", help="print JSON only")
    args = parser.parse_args()
    if args.part:
        print(json.dumps(PARTS[args.part](args)))
        return
    if args.keep:
        Path(args.keep).mkdir(parents=True, exist_ok=True)
    store = args.keep or tempfile.mkdtemp(prefix="wb-long-")
    results = {}
    try:
        for part in args.parts.split(","):
            cmd = [sys.executable, __file__, "--part", part, "--store", store]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                results[part] = {"error": proc.stderr.strip().splitlines()[-1:]}
                continue
            results[part] = json.loads(proc.stdout.strip().splitlines()[-1])
    finally:
        if not args.keep:
            shutil.rmtree(store, ignore_errors=True)
    if args.json:
        print(json.dumps(results, indent=2))
        return
    for part, values in results.items():
        print(f"[{part}]")
        for key, value in values.items():
            shown = f"{value:,.2f}" if isinstance(value, float) else value
            print(f"  {key:28s} {shown}")


if __name__ == "__main__":
    main()
