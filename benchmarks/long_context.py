"""Long contexts: recording and scoring at a model's full context in bounded memory, and viewing it.

Each measurement runs in its own subprocess, so that its peak RSS is its own:

- ``long``: record one 8,192-token prompt (smollm2's context; consecutive prose of the
  Python documentation, :func:`workbench.inputs.corpus.python_docs`, no repetition) with
  ``topk`` patterns: peak RSS (target under 2 GiB), bytes on disk (patterns; the residual
  stream is recorded too and counted apart), tokens/s (target 2x the 44 tokens/s of the
  eager pattern).
- ``reduce8k``: pattern reductions (first-token and previous-token scores of every head)
  on the same 8,192 tokens: time and peak RSS.
- ``long32k``: the same at 32,768 tokens on a model with that context (``--model32k``;
  default a tiny random Gemma 3 with Gemma 3's context, window and layer pattern, built
  from ``tests/architectures/families.py``): record with topk, then attention-sinks and
  previous-token scores of every head on the document: peak RSS (target under 6 GiB) and
  wall time of each.
- ``scaling``: peak RSS of a topk recording against the prompt's length T (smollm2 at 1k,
  2k, 4k, 8k; the 32k model at 4k .. 32k), each T in its own process, and the exponent of
  the peak above the loaded model (``peak - rss after loading``) fitted against T on a
  log-log scale: 1 is linear, 2 quadratic.
- ``dense2k`` / ``topk2k`` / ``qk2k``: one 2,048-token prompt recorded dense, as topk and
  as qk: bytes, time; ``qk8k``: the 8,192-token prompt of ``long`` as qk.
- ``qk_dtype``: one 2,048-token prompt recorded as qk with queries and keys in float32
  (the model's dtype: exact) and in bfloat16: their bytes (in memory and on disk), and the
  bfloat16 tiles' error over the last 256 query rows of every layer and head, against the
  float32 tiles and against the bound ``w (e^eta - 1)`` of ``QKLayer.score_error``.
- ``tiles``: on a qk recording of 8,192 tokens, the time to compute a 512 x 512 tile, a
  key's whole received-attention column and every row's statistics of one head.
- ``qk32k``: the 32,768-token document of ``long32k`` recorded as qk on ``--model32k``:
  bytes on disk and in the arrays against ``T x (heads + kv_heads) x d_head x layers x 4
  B`` (target within 10%), time (target: no slower than ``long32k``'s topk), peak RSS;
  then a 512 x 512 tile on a global and on a sliding-window layer (target under 0.5 s),
  one query's row against every key, and a key's whole received-attention column on the
  global layer (target under 5 s).
- ``many100`` / ``many1000``: 100 and 1,000 prompts of 128 tokens (the corpus repeated
  when it runs out): peak RSS, which should be flat in the number of prompts.
- ``view``: the long-context page of the dashboard on the newest recording in the store
  (the 8,192-token ``long``, or the 32,768-token ``qk32k``), in Chromium: time from the
  page request to the rendered overview (target under 2 s for the 8k topk recording) and
  received-attention strip, from a change of pooling on the open page to the redrawn
  overview, and from a box drawn on the overview to the rendered window: 256 tokens a
  side (token by token) and 4,096 (pooled).

``--smoke`` runs every part but ``view`` (which needs Chromium) at a tiny size on
``--model`` (a local folder), in one process, so that a benchmark that no longer runs fails
the tests (``tests/unit/test_benchmarks.py``).

Usage:
    python benchmarks/long_context.py [--parts long,dense2k,...] [--json]
    python benchmarks/long_context.py --parts long --keep /tmp/wb-8k   # keep the 8k recording
    python benchmarks/long_context.py --parts view --keep /tmp/wb-8k   # then view it again
    python benchmarks/long_context.py --parts long32k,scaling
    python benchmarks/long_context.py --parts qk32k --model32k gemma3 --keep /tmp/wb-32k
    python benchmarks/long_context.py --parts view --keep /tmp/wb-32k  # the page at 32k, qk
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
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from workbench.core.options import Dtype, PatternStorage
    from workbench.recording.reader import Recording

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


def _record(out: Path, n_prompts: int, n_tokens: int, patterns: PatternStorage,
            model_name: str, qk_dtype: Dtype | None = None) -> dict:
    from workbench.models.load import load_model
    from workbench.recording.writer import record
    from workbench.store.runs import RunStore

    model = load_model(model_name)
    prompts, repeats = _prompts(model, n_prompts, n_tokens)
    store = RunStore(out)
    rss_before = peak_rss_mib()
    t0 = time.perf_counter()
    with store.start("record", model.info, {"patterns": patterns}) as run:
        rec = record(model, prompts, run.dir / "recording", patterns=patterns,
                     max_batch_tokens=max(2048, n_tokens), qk_dtype=qk_dtype)
    seconds = time.perf_counter() - t0
    folder = store.get(run.final).path / "recording" / "recording.zarr"
    resid = sum(_bytes(p) for p in folder.glob("resid"))
    return {"model": model.info.name, "prompts": n_prompts, "tokens": n_tokens,
            "patterns": rec.patterns, "corpus_repeats": repeats, "seconds": seconds,
            "tok_s": n_prompts * n_tokens / seconds,
            "pattern_mb": (_bytes(folder) - resid) / MB, "resid_mb": resid / MB,
            "peak_rss_before_gib": rss_before / 1024, "peak_rss_gib": peak_rss_mib() / 1024,
            "run": run.final.name}


def part_long(args: argparse.Namespace) -> dict:
    return _record(Path(args.store), 1, args.tokens or 8192, "topk", args.model)


def _scores(model_name: str, n_tokens: int) -> dict:
    """Attention-sinks (first-token, BOS share) and previous-token scores of every head on
    one ``n_tokens`` prompt, with their intervals and nulls (``score_heads``)."""
    from workbench.models.load import load_model
    from workbench.scores import metrics
    from workbench.scores.heads import score_heads

    model = load_model(model_name)
    prompts, _ = _prompts(model, 1, n_tokens)
    t0 = time.perf_counter()
    table = score_heads(model, prompts, metrics.reductions("first_token", "previous_token"),
                        inputs="long document", n_boot=10, max_batch_tokens=n_tokens)
    first = table[table.metric == "first_token"].nlargest(1, "score").iloc[0]
    prev = table[table.metric == "previous_token"].nlargest(1, "score").iloc[0]
    return {"seconds": time.perf_counter() - t0, "rows": len(table),
            "top_sink_head": f"L{first['layer']}H{first['head']} {first['score']:.3f}",
            "top_previous_token_head": f"L{prev['layer']}H{prev['head']} {prev['score']:.3f}",
            "peak_rss_gib": peak_rss_mib() / 1024}


def part_reduce8k(args: argparse.Namespace) -> dict:
    """First-token and previous-token scores of every head on the same 8,192 tokens."""
    return _scores(args.model, args.tokens or 8192)


def long_model(folder: Path, smoke: bool) -> str:
    """A tiny random Gemma 3 with a 32,768-token context, saved in ``folder`` (once): Gemma
    3's sliding window of 512 and its 5 local : 1 global layers (6 layers); the tiny
    family's 4 query heads over 1 key-value head, q/k norms, d_model 32."""
    from tests import tiny
    from tests.architectures.families import gemma3_config, instantiate

    if not (folder / "config.json").is_file():
        tokenizer = tiny.tiny_tokenizer(folder / "tokenizer")
        layers = 2 if smoke else 6
        cfg = gemma3_config(len(tokenizer), sliding_window=16 if smoke else 512,
                            num_hidden_layers=layers,
                            layer_types=["sliding_attention"] * (layers - 1) + ["full_attention"])
        tiny.save_folder(instantiate("Gemma3ForCausalLM", cfg), tokenizer, folder)
    return str(folder)


def part_long32k(args: argparse.Namespace) -> dict:
    """Record 32,768 tokens with topk on the 32k model, then score every head on them; the
    two steps each in their own process (their own peak RSS)."""
    tokens = args.tokens or 32768
    model = args.model32k or long_model(Path(args.store) / "gemma3-32k", args.smoke)
    recorded = _child("record_one", args, model=model, tokens=tokens)
    scored = _child("score_one", args, model=model, tokens=tokens)
    return {"model": model, "tokens": tokens, "record_s": recorded["seconds"],
            "record_peak_rss_gib": recorded["peak_rss_gib"],
            "record_rss_after_load_gib": recorded["peak_rss_before_gib"],
            "pattern_mb": recorded["pattern_mb"], "score_s": scored["seconds"],
            "score_peak_rss_gib": scored["peak_rss_gib"],
            "top_sink_head": scored["top_sink_head"],
            "top_previous_token_head": scored["top_previous_token_head"]}


def part_record_one(args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory(dir=args.store) as tmp:
        return _record(Path(tmp), 1, args.tokens, "topk", args.model)


def part_score_one(args: argparse.Namespace) -> dict:
    return _scores(args.model, args.tokens)


SCALING = {"smollm2": (1024, 2048, 4096, 8192), "32k": (4096, 8192, 16384, 32768)}
SMOKE_SCALING = (64, 128, 256)


def part_scaling(args: argparse.Namespace) -> dict:
    """Peak RSS of a topk recording against T, each T in its own process; the exponent of
    the peak above the loaded model, fitted against T (log-log least squares)."""
    import numpy as np

    models = {"smollm2": args.model,
              "32k": args.model32k or long_model(Path(args.store) / "gemma3-32k", args.smoke)}
    out = {}
    for label, model in models.items():
        lengths = SMOKE_SCALING if args.smoke else SCALING[label]
        runs = [_child("record_one", args, model=model, tokens=t) for t in lengths]
        above = [max(1e-3, r["peak_rss_gib"] - r["peak_rss_before_gib"]) for r in runs]
        slope = float(np.polyfit(np.log(lengths), np.log(above), 1)[0])
        out[label] = {"tokens": list(lengths), "peak_rss_gib": [r["peak_rss_gib"] for r in runs],
                      "above_loaded_gib": above, "seconds": [r["seconds"] for r in runs],
                      "fitted_exponent": slope}
    return out


def _child(part: str, args: argparse.Namespace, *, model: str, tokens: int) -> dict:
    """Run one part in a fresh process (its own peak RSS) on ``model`` at ``tokens`` (in
    this process with ``--smoke``)."""
    if args.smoke:
        return CHILDREN[part](argparse.Namespace(**{**vars(args), "model": model,
                                                     "tokens": tokens}))
    cmd = [sys.executable, __file__, "--part", part, "--store", args.store, "--model", model,
           "--tokens", str(tokens)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{part} at {tokens} tokens failed: {proc.stderr.strip()[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


RECORDINGS: dict[str, tuple[int, int, PatternStorage]] = {
    "dense2k": (1, 2048, "dense"), "topk2k": (1, 2048, "topk"), "qk2k": (1, 2048, "qk"),
    "qk8k": (1, 8192, "qk"), "many100": (100, 128, "auto"), "many1000": (1000, 128, "auto")}
"""Recording parts: ``(prompts, tokens per prompt, pattern storage)``, each in a fresh store."""
SMOKE_RECORDINGS: dict[str, tuple[int, int, PatternStorage]] = {
    "dense2k": (1, 64, "dense"), "topk2k": (1, 64, "topk"), "qk2k": (1, 64, "qk"),
    "qk8k": (1, 64, "qk"), "many100": (4, 16, "auto"), "many1000": (8, 16, "auto")}


def part_recording(args: argparse.Namespace) -> dict:
    sizes = (SMOKE_RECORDINGS if args.smoke else RECORDINGS)[args.part]
    with tempfile.TemporaryDirectory(dir=args.store) as tmp:
        return _record(Path(tmp), *sizes, args.model)


def _median_s(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def _tile_times(rec: Recording, layer: int, head: int = 0) -> dict:
    """At one layer and head of a ``qk`` recording's first prompt: a 512 x 512 tile from
    the middle of the prompt (queries from the middle on, the keys before them), the first
    (which reads the layer's stored tensors) and the median of 5 after it."""
    n = rec.length(0)
    side, mid = min(512, n // 2), n // 2

    def tile() -> None:
        rec.tile(0, layer, head, queries=slice(mid, mid + side), keys=slice(mid - side, mid))
    first = _median_s(tile, 1)  # reads the layer's queries, keys and lse first
    return {"tile_side": side, "first_tile_s": first, "tile_s": _median_s(tile, 5)}


def part_tiles(args: argparse.Namespace) -> dict:
    """A ``qk`` recording of one prompt (``--tokens``, default 8,192), then, at its middle
    layer and head 0: a 512 x 512 tile (:func:`_tile_times`), the whole received-attention
    column, and every row's statistics."""
    from workbench.recording.reader import Recording

    n = args.tokens or 8192
    with tempfile.TemporaryDirectory(dir=args.store) as tmp:
        made = _record(Path(tmp), 1, n, "qk", args.model)
        rec = Recording.open(Path(tmp) / made["run"])
        layer = rec.n_layers // 2
        return {**made, **_tile_times(rec, layer),
                "received_s": _median_s(lambda: rec.received(0, layer, 0), 1),
                "received_computed_s": _median_s(
                    lambda: rec.qk_layer(0, layer).received(0), 1),
                "row_stats_s": _median_s(lambda: rec.row_stats(0, layer, 0), 1)}


def _qk_bytes(rec: Recording) -> dict:
    """A ``qk`` recording's queries, keys, row log-sum-exps and the first-key and received
    columns where it has them: the bytes on disk, the arrays' own bytes, and the spec's size
    ``T x (heads + kv_heads) x d_head x layers x element size`` (queries and keys only) for
    its longest prompt."""
    import numpy as np

    from workbench.recording.qk import STORED_AS

    facts, t = rec.index.qk, (rec.index.longest or 0) * len(rec.prompts)
    assert facts is not None, "not a qk recording"
    size = np.dtype(STORED_AS[facts.dtype]).itemsize
    formula = t * (rec.n_heads + facts.kv_heads) * facts.d_head * rec.n_layers * size
    kinds = ["lse"] + [kind for kind in ("first", "received") if getattr(facts, kind)]
    rows = len(kinds) * t * rec.n_heads * rec.n_layers * 4  # one float32 a head and token
    folder = rec.root / "recording.zarr"
    disk = {kind: _bytes(folder / kind) for kind in ("q", "k", *kinds)}
    return {"qk_dtype": facts.dtype, "target_mb": formula / MB,
            "arrays_mb": (formula + rows) / MB, "disk_mb": sum(disk.values()) / MB,
            **{f"{kind}_disk_mb": disk[kind] / MB for kind in disk},
            "disk_to_target": sum(disk.values()) / formula,
            "arrays_to_target": (formula + rows) / formula}


def part_qk32k(args: argparse.Namespace) -> dict:
    """Record the 32,768-token document on the 32k model (``--model32k``) as ``qk``: bytes
    (against the spec's ``T x (heads + kv_heads) x d_head x layers x 4 B``), time, peak
    RSS; then, at head 0: a 512 x 512 tile (:func:`_tile_times`) on the middle global
    (full-attention) layer and on the middle sliding-window layer, the last query's row
    against every key (a ``1 x T`` tile), and the whole received-attention column and
    every row's statistics of the global layer (the received column read as stored, and
    computed from the queries and keys as a recording made before it was stored does)."""
    from workbench.recording.reader import Recording

    n = args.tokens or 32768
    model = args.model32k or long_model(Path(args.store) / "gemma3-32k", args.smoke)
    made = _record(Path(args.store), 1, n, "qk", model)
    rec = Recording.open(Path(args.store) / made["run"])  # kept: `--parts view` reads it
    assert rec.index.qk is not None  # recorded as qk just above
    windows = rec.index.qk.window
    full = [layer for layer, w in enumerate(windows) if w is None]
    sliding = [layer for layer, w in enumerate(windows) if w is not None]
    out: dict = {**made, **_qk_bytes(rec)}
    for kind, layers in (("global", full), ("sliding", sliding)):
        if layers:
            layer = layers[len(layers) // 2]
            out[f"{kind}_layer"] = layer
            out.update({f"{kind}_{key}": value
                        for key, value in _tile_times(rec, layer).items()})
    layer = full[len(full) // 2]  # the global layer, read already
    out["row_s"] = _median_s(lambda: rec.tile(0, layer, 0, queries=slice(n - 1, n)), 3)
    out["received_s"] = _median_s(lambda: rec.received(0, layer, 0), 1)  # stored, read
    out["received_computed_s"] = _median_s(lambda: rec.qk_layer(0, layer).received(0), 1)
    out["row_stats_s"] = _median_s(lambda: rec.row_stats(0, layer, 0), 1)
    out["peak_rss_after_reads_gib"] = peak_rss_mib() / 1024
    return out


QK_ERROR_ROWS = 256
"""The last query rows (the longest) whose weights ``qk_dtype`` compares, per layer and head."""


def part_qk_dtype(args: argparse.Namespace) -> dict:
    """One prompt (``--tokens``, default 2,048) recorded as qk twice, queries and keys in
    float32 and in bfloat16: their bytes, and the bfloat16 tiles' largest error over the
    last :data:`QK_ERROR_ROWS` rows of every layer and head, absolute and as a share of the
    bound ``w (e^eta - 1) + 1e-6`` (``eta`` from the float32 queries and keys at bfloat16's
    machine epsilon; 1e-6 is what float32 tiles meet against the dense pattern)."""
    import torch

    from workbench.models.fused import HALF_EPSILON
    from workbench.recording.reader import Recording

    n = args.tokens or 2048
    out: dict = {"tokens": n}
    with tempfile.TemporaryDirectory(dir=args.store) as tmp:
        recs = {}
        for dtype in ("float32", "bfloat16"):
            made = _record(Path(tmp) / dtype, 1, n, "qk", args.model, qk_dtype=dtype)
            rec = recs[dtype] = Recording.open(Path(tmp) / dtype / made["run"])
            names = [name for name in rec.array_names() if name.startswith(("q/", "k/"))]
            folder = rec.root / "recording.zarr"
            out[dtype] = {"seconds": made["seconds"],
                          "qk_mb": sum(rec.array(name).nbytes for name in names) / MB,
                          "qk_disk_mb": (_bytes(folder / "q") + _bytes(folder / "k")) / MB,
                          "lse_disk_mb": _bytes(folder / "lse") / MB}
        rows = slice(max(0, n - QK_ERROR_ROWS), n)
        worst_abs = worst_ratio = worst_eta = 0.0
        for layer in range(recs["float32"].n_layers):
            exact, rounded = (recs[d].qk_layer(0, layer) for d in ("float32", "bfloat16"))
            eta = exact.score_error(HALF_EPSILON[torch.bfloat16])[:, rows]
            worst_eta = max(worst_eta, float(eta.max()))
            for head in range(exact.n_heads):
                want = exact.tile(head, rows)
                error = (rounded.tile(head, rows) - want).abs()
                bound = want * torch.expm1(eta[head, :, None]) + 1e-6
                worst_abs = max(worst_abs, float(error.max()))
                worst_ratio = max(worst_ratio, float((error / bound).max()))
        out["bfloat16"].update(max_abs_error=worst_abs, worst_ratio_to_bound=worst_ratio,
                               max_eta=worst_eta, rows_compared=f"{rows.start}..{n - 1}")
        out["bytes_ratio"] = out["bfloat16"]["qk_mb"] / out["float32"]["qk_mb"]
    return out


def part_view(args: argparse.Namespace) -> dict:
    """The long-context page in Chromium on the newest recording left in the store (the 8k
    ``long``, or the 32k ``qk32k``), at its strongest sink as the page opens: the page
    request to the rendered overview (and the received-attention strip under it), a
    change of pooling, and two boxes drawn from the middle of the prompt: 256 tokens a
    side (drawn token by token) and 4,096 (pooled to 256 cells a side)."""
    from playwright.sync_api import sync_playwright

    from workbench.recording.reader import Recording

    runs = sorted(p for p in Path(args.store).iterdir() if (p / "run.json").is_file())
    rec = Recording.open(runs[-1])
    n, middle = rec.length(0), rec.length(0) // 2
    out: dict = {"run": runs[-1].name, "patterns": rec.patterns, "tokens": n}
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
            page.goto(f"http://127.0.0.1:{port}/long-context?run={runs[-1].name}")
            page.wait_for_function(_drawn("overview", "pooling"), timeout=300_000)
            out["overview_s"] = time.perf_counter() - t0
            page.wait_for_function(_drawn("received", "receives"), timeout=300_000)
            out["overview_and_strip_s"] = time.perf_counter() - t0
            t0 = time.perf_counter()  # the page open: another overview, sum-pooled
            page.get_by_label("sum").check()
            page.wait_for_function(_drawn("overview", "sum pooling"), timeout=300_000)
            out["overview_redraw_s"] = time.perf_counter() - t0
            for span in (256, 4096):
                span = min(span, middle)
                t0 = time.perf_counter()  # a box drawn on the overview from the middle
                page.evaluate(BRUSH % (middle - span, middle, middle + span, middle))
                page.wait_for_function(_drawn("window", f"queries {middle}.."),
                                       timeout=300_000)
                out[f"zoom_{span}_s"] = time.perf_counter() - t0
                out[f"zoom_{span}_title"] = page.evaluate(TITLE % "window").split("<br>")[0]
                page.evaluate(BRUSH % (0, 1, 1, 0))  # another box, so the next one is new
                page.wait_for_function(_drawn("window", "queries 0.."), timeout=300_000)
            browser.close()
    finally:
        server.terminate()
        server.wait(timeout=30)
    return out


BRUSH = """() => Plotly.relayout(document.querySelector('#long-context-overview .js-plotly-plot'),
    {'xaxis.range[0]': %d, 'xaxis.range[1]': %d, 'yaxis.range[0]': %d, 'yaxis.range[1]': %d})"""
TITLE = """() => document.querySelector('#long-context-%s .js-plotly-plot').layout.title.text"""


def _drawn(graph: str, text: str) -> str:
    """A script true once the page's ``graph`` is drawn with ``text`` in its title."""
    return f"""() => {{
        const el = document.querySelector('#long-context-{graph} .js-plotly-plot');
        return el && el.layout && el.layout.title && el.layout.title.text.includes('{text}');
    }}"""


def _wait_up(url: str) -> None:
    import urllib.request

    for _ in range(240):
        try:
            urllib.request.urlopen(url, timeout=1)
            return
        except OSError:  # the server is still starting
            time.sleep(0.5)
    raise RuntimeError(f"the dashboard did not start at {url}")


PARTS = {"long": part_long, "reduce8k": part_reduce8k, "long32k": part_long32k,
         "scaling": part_scaling, **dict.fromkeys(RECORDINGS, part_recording),
         "qk_dtype": part_qk_dtype, "tiles": part_tiles, "qk32k": part_qk32k,
         "view": part_view}
CHILDREN = {"record_one": part_record_one, "score_one": part_score_one}
"""Parts that other parts run in their own processes."""
SMOKE_TOKENS = {"long": 64, "reduce8k": 64, "long32k": 256, "tiles": 64, "qk_dtype": 64,
                "qk32k": 256}


def _run(part: str, args: argparse.Namespace, store: str) -> dict:
    """One part in its own process (in this one with ``--smoke``: its sizes are tiny)."""
    if args.smoke:
        tokens = SMOKE_TOKENS.get(part)
        return PARTS[part](argparse.Namespace(**{**vars(args), "part": part, "store": store,
                                                 "tokens": tokens}))
    cmd = [sys.executable, __file__, "--part", part, "--store", store, "--model", args.model,
           *(["--model32k", args.model32k] if args.model32k else [])]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--part", choices=[*PARTS, *CHILDREN], help=argparse.SUPPRESS)
    parser.add_argument("--store", help=argparse.SUPPRESS)
    parser.add_argument("--tokens", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--parts", default=",".join(PARTS),
                        help="comma-separated parts to run (default all)")
    parser.add_argument("--model", default="smollm2", help="the model (default smollm2)")
    parser.add_argument("--model32k", help="the model with a 32,768-token context (default a "
                                           "tiny random Gemma 3)")
    parser.add_argument("--keep", metavar="DIR", help="run in this store and keep it (so "
                        "`--parts view --keep DIR` views the newest recording left there)")
    parser.add_argument("--smoke", action="store_true",
                        help="every part but view at a tiny size on --model (a local folder)")
    parser.add_argument("--json", action="store_true", help="print JSON only")
    args = parser.parse_args()
    if args.part:
        print(json.dumps({**PARTS, **CHILDREN}[args.part](args)))
        return
    if args.keep:
        Path(args.keep).mkdir(parents=True, exist_ok=True)
    store = args.keep or tempfile.mkdtemp(prefix="wb-long-")
    parts = [p for p in args.parts.split(",") if not (args.smoke and p == "view")]
    try:
        results = {part: _run(part, args, store) for part in parts}
    finally:
        if not args.keep:
            shutil.rmtree(store, ignore_errors=True)
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        for part, values in results.items():
            print(f"[{part}]")
            for key, value in values.items():
                shown = f"{value:,.2f}" if isinstance(value, float) else value
                print(f"  {key:28s} {shown}")
    if any("error" in values for values in results.values()):
        sys.exit("some parts failed")


if __name__ == "__main__":
    main()
