"""Time from submit to pattern on the Live page's server side, per model.

For each model a :class:`workbench.harness.live.LiveQueue` over a fresh run store takes:

- a first job, which loads the model (``first_s``: submit to a complete run, the load
  included);
- ``--repeats`` jobs of a prompt of ``--tokens`` tokens of natural text with the model
  kept loaded, each timed from submit until the page's figures are built from the run:
  the run completes, the opening metric is scored (``pattern_scores``; the page scores a
  metric when it is shown), the opening head is chosen, and its pattern heatmap and the
  scores heatmap are made (the figure functions the page calls). The median and the
  range are reported.

In the browser the page polls the job every ``POLL_MS`` (300 ms) and draws the figure, so
a reader waits up to that much longer (``tests/browser/test_live_page.py`` times the
whole round trip on the tiny model).

``--smoke`` runs one short job on ``--model`` (a local folder), so that a benchmark that
no longer runs fails the tests (``tests/unit/test_benchmarks.py``).

Usage:
    python benchmarks/live.py [--models smollm2 minilm] [--tokens 64] [--repeats 5] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

TIMEOUT = 600.0


def text_of(model, n_tokens: int) -> tuple[str, int]:
    """Natural text cut to at most ``n_tokens`` of ``model``'s tokens (framing included),
    and its length in tokens."""
    from workbench.inputs.prompts import Prompt, load_prompt_set

    words = " ".join(p.text for p in load_prompt_set("natural")).split()
    lo, hi = 1, min(len(words), n_tokens)  # a word is at least one token
    while lo < hi:  # the most words that fit
        mid = (lo + hi + 1) // 2
        if len(model.encode(Prompt(text=" ".join(words[:mid])))[0]) <= n_tokens:
            lo = mid
        else:
            hi = mid - 1
    text = " ".join(words[:lo])
    return text, len(model.encode(Prompt(text=text))[0])


def until_figure(queue, model: str, text: str) -> float:
    """Seconds from submit to the page's figures of the job's run."""
    from workbench.harness import live
    from workbench.recording.reader import Recording
    from workbench.views import style

    start = time.perf_counter()
    status = queue.wait(queue.submit(model, text).id, TIMEOUT)
    if status.state != "complete":
        raise SystemExit(f"{model}: the job {status.state}: {status.error}")
    rec = Recording.open(queue.store.get(status.run_id).path)
    scores = live.pattern_scores(rec, names=[live.DEFAULT_METRIC])  # as the page opens
    layer, head = live.opening_head(scores)
    style.pattern_heatmap(rec.pattern(0, layer, head), rec.tokens(0), "pattern")
    style.head_heatmap(scores, live.DEFAULT_METRIC)
    return time.perf_counter() - start


def measure(model: str, tokens: int, repeats: int) -> dict:
    from workbench.harness.live import LiveQueue

    with tempfile.TemporaryDirectory() as runs:
        queue = LiveQueue(runs, models=lambda: [model])
        start = time.perf_counter()
        first = queue.wait(queue.submit(model, "The cat sat.").id,
                           TIMEOUT)
        if first.state != "complete":
            raise SystemExit(f"{model}: the first job {first.state}: {first.error}")
        first_s = time.perf_counter() - start
        text, n = text_of(queue.cache.peek(model, "cpu"), tokens)
        times = [until_figure(queue, model, text) for _ in range(repeats)]
    return {"model": Path(model).name, "tokens": n, "first_s": round(first_s, 2),
            "median_s": round(statistics.median(times), 3),
            "min_s": round(min(times), 3), "max_s": round(max(times), 3),
            "repeats": repeats}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=["smollm2", "minilm"])
    parser.add_argument("--model", help="--smoke: the model folder")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    if args.smoke:
        args.models, args.tokens, args.repeats = [args.model], 16, 1
    rows = [measure(m, args.tokens, args.repeats) for m in args.models]
    load = os.getloadavg()
    if args.json:
        print(json.dumps({"rows": rows, "loadavg": load}))
        return
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} cores")
    for r in rows:
        print(f"{r['model']:>10}  {r['tokens']:>4} tokens  first job (load) {r['first_s']:6.2f} s"
              f"  submit to figure {r['median_s']:6.3f} s (median of {r['repeats']}, "
              f"{r['min_s']:.3f}..{r['max_s']:.3f})")


if __name__ == "__main__":
    main()
