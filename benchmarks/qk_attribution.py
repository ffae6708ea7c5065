"""Time and peak memory of QK attribution on smollm2, and how they grow with heads and prompts.

The reference point (issue 15): the top 5 induction heads (by Olsson's score on the same
prompts) attributed on 16 ``repeated-random`` prompts (40 tokens repeated twice, after
BOS; every second-repeat query with its induction target). Then the number of heads
(1, 3, 5) at 16 prompts and the number of prompts (4, 8, 16) at 5 heads. Each setting runs
in its own subprocess so that its peak RSS is its own; ``extra_mib`` is the peak minus the
RSS after the model loaded and ran one forward pass (what the attribution itself holds).
The path-patch cross-check and the tables are not timed.

Usage:
    nice -n 10 python benchmarks/qk_attribution.py [--json] [--settings 5x16,1x16]
        [--heads 18.6,17.4,17.3]
    python benchmarks/qk_attribution.py --smoke MODEL_FOLDER   # the tests' tiny run
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _prompts(model, n: int):
    from workbench.inputs.prompts import load_prompt_set

    return load_prompt_set("repeated-random", model, n_prompts=n, seq_len=40, repeats=2,
                           seed=0)


def part_heads(model_name: str = "smollm2", n_prompts: int = 16) -> dict:
    """The top 5 induction heads on the 16 reference prompts."""
    from workbench.models.load import load_model
    from workbench.scores import patterns
    from workbench.scores.heads import score_heads, top_heads

    model = load_model(model_name)
    scores = score_heads(model, _prompts(model, n_prompts), {"induction": patterns.induction},
                         inputs="repeated random tokens", n_boot=1)
    return {"heads": top_heads(scores, "induction", 5)}


def part_attribute(heads: list[list[int]], n_prompts: int, model_name: str = "smollm2") -> dict:
    import torch

    from experiments.qk_attribution.measure import attribute_all
    from workbench.models.load import load_model

    model = load_model(model_name)
    prompts = _prompts(model, n_prompts)
    with torch.no_grad():
        model.bridge(torch.tensor([list(prompts[0].token_ids)]), return_type=None)
    base = peak_rss_mib()
    start = time.perf_counter()
    atts = attribute_all(model, prompts, [tuple(h) for h in heads], "induction", 5)
    seconds = time.perf_counter() - start
    n_pairs = sum(len(h.score) for a in atts for h in a.heads)
    error = max(h.error for a in atts for h in a.heads)
    return {"n_heads": len(heads), "n_prompts": n_prompts, "seconds": seconds,
            "seconds_per_prompt": seconds / n_prompts, "peak_mib": peak_rss_mib(),
            "extra_mib": peak_rss_mib() - base, "pairs": n_pairs, "max_rel_error": error}


def _child(part: str, **kwargs) -> dict:
    code = (f"import json, sys; sys.path.insert(0, '.'); from benchmarks.qk_attribution "
            f"import part_{part}; print(json.dumps(part_{part}(**{kwargs!r})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


SETTINGS = "5x16,1x16,3x16,5x4,5x8"
"""``heads x prompts``: the reference first, then the growth with heads and with prompts."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print JSON lines, not a table")
    parser.add_argument("--settings", default=SETTINGS,
                        help=f"comma-separated HEADSxPROMPTS (default {SETTINGS})")
    parser.add_argument("--heads", help="the heads, e.g. 18.6,17.4 (default: the top 5 "
                        "induction heads, scored first)")
    parser.add_argument("--smoke", metavar="MODEL", help="one head on 2 prompts of MODEL (a "
                        "local folder), in this process: the benchmark still runs")
    args = parser.parse_args()
    if args.smoke:
        heads = part_heads(args.smoke, 2)["heads"][:1]
        print(json.dumps(part_attribute(heads, 2, args.smoke)))
        return
    if args.heads:
        heads = [[int(x) for x in h.split(".")] for h in args.heads.split(",")]
    else:
        heads = _child("heads")["heads"]
    settings = [tuple(int(x) for x in s.split("x")) for s in args.settings.split(",")]
    print("heads: " + ", ".join(f"L{a}H{b}" for a, b in heads), flush=True)
    if not args.json:
        print(f"{'heads':>5} {'prompts':>7} {'seconds':>8} {'s/prompt':>8} {'peak MiB':>9} "
              f"{'extra MiB':>9} {'pairs':>6} {'max rel err':>11}", flush=True)
    for k, n in settings:  # each row as soon as it is measured
        r = _child("attribute", heads=heads[:k], n_prompts=n)
        print(json.dumps(r) if args.json else
              f"{r['n_heads']:>5} {r['n_prompts']:>7} {r['seconds']:>8.1f} "
              f"{r['seconds_per_prompt']:>8.2f} {r['peak_mib']:>9.0f} {r['extra_mib']:>9.0f} "
              f"{r['pairs']:>6} {r['max_rel_error']:>11.1e}", flush=True)


if __name__ == "__main__":
    main()
