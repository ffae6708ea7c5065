"""How far every head score moves from float32 when the model runs in bfloat16 or float16.

For each model (default both bundled ones), every head's score of every pattern metric
(:mod:`workbench.scores.metrics`) and of attention-sinks' received-attention metrics
(``share_<type>``, ``top1_share``), averaged over the prompts as ``score_heads`` reports
it, is computed with the model loaded in float32 and in each other dtype, on the same
prompts: 16 x 128 tokens of the Python documentation's prose, and 16 ``repeated-random``
prompts (32 random tokens repeated twice, for the induction and duplicate-token scores).
Per metric and dtype: the largest and the 99th percentile of ``|score - score_float32|``
over every (layer, head), and whether the 10 highest-scoring heads are the same heads in
the same order (``same``), the same heads in another order (``reordered``) or not
(``changed: n of 10``).

An experiment is *safe* in a dtype when every score it reports moves by at most
:data:`SAFE` on both models (0.01 for scores in [0, 1], 0.02 nats of entropy, 0.5 tokens
of distance) and no top-10 list of it loses a head; the thresholds are fixed here, before
any run. Experiments whose numbers are not pattern scores (losses, gradients, exact
decompositions) are outside this table.

Usage:
    python benchmarks/bf16.py [--models smollm2,minilm] [--dtypes bfloat16,float16] [--json]
    python benchmarks/bf16.py --markdown          # the table of docs/performance.md
"""

from __future__ import annotations

import argparse
import json
import time

DTYPES = ("bfloat16", "float16")
N_PROMPTS, N_TOKENS, SEQ_LEN = 16, 128, 32
SAFE = {"entropy": 0.02, "mean_distance": 0.5}
"""Largest move of a score that leaves an experiment safe, per metric (default 0.01)."""
DEFAULT_SAFE = 0.01
EXPERIMENT_METRICS = {
    "head-overview": ("entropy", "normalized_entropy", "mean_distance", "self_attention"),
    "previous-token-heads": ("previous_token", "next_token", "duplicate_token"),
    "induction-heads (head scores)": ("induction", "induction_pooled", "previous_token"),
    "attention-sinks (head scores)": ("first_token", "entropy", "normalized_entropy",
                                      "share_*", "top1_share"),
}
"""The head scores each experiment reports (names ending in ``*``: every such metric)."""


def _prompts(model, n_prompts: int, n_tokens: int, seq_len: int):
    from workbench.inputs.corpus import python_docs, token_chunks
    from workbench.inputs.prompts import load_prompt_set

    natural = token_chunks(model, python_docs(), n_chunks=n_prompts, n_tokens=n_tokens)
    repeated = load_prompt_set("repeated-random", model, n_prompts=n_prompts, seq_len=seq_len,
                               repeats=2, seed=0)
    return natural, repeated


def _reductions(model) -> dict:
    from experiments.attention_sinks.scans import sink_reductions
    from workbench.inputs.token_types import TokenTyper, model_token_types
    from workbench.scores import metrics

    names = [m.name for _, m in metrics.METRICS.items() if m.kind == "pattern"]
    if model.info.causal:
        names.remove("next_token")  # 0 by construction under a causal mask
    sinks = sink_reductions(TokenTyper.for_model(model), model_token_types(model))
    return {**metrics.reductions(*names),
            **{k: v for k, v in sinks.items() if k.startswith("share_") or k == "top1_share"}}


def head_scores(name: str, dtype: str, sizes: tuple[int, int, int] = (N_PROMPTS, N_TOKENS,
                                                                      SEQ_LEN)):
    """Every head's mean score of every metric, ``(input, layer, head, metric) -> score``,
    with the model loaded in ``dtype``; and the seconds the two scans took."""
    from workbench.models.load import load_model
    from workbench.recording.reductions import reduce_patterns

    model = load_model(name, dtype=dtype)
    fns = _reductions(model)
    natural, repeated = _prompts(model, *sizes)
    t0 = time.perf_counter()
    frames = []
    for label, prompts in (("natural", natural), ("repeated", repeated)):
        chosen = fns if label == "natural" else {
            k: v for k, v in fns.items() if k in ("induction", "induction_pooled",
                                                  "duplicate_token")}
        per_prompt = reduce_patterns(model, prompts, chosen)
        frames.append(per_prompt.groupby(["layer", "head", "metric"]).score.mean()
                      .rename(label))
    seconds = time.perf_counter() - t0
    import pandas as pd

    scores = pd.concat(frames, axis=1)
    # each metric from the input it is meant for: induction and duplicates on repeats
    on_repeats = scores.index.get_level_values("metric").isin(
        ["induction", "induction_pooled", "duplicate_token"])
    return scores.repeated.where(on_repeats, scores.natural), seconds


def _top10(scores) -> list[tuple[int, int]]:
    return [(int(layer), int(head)) for layer, head in scores.nlargest(10).index]


def compare(reference, other) -> list[dict]:
    """Per metric: the largest and 99th-percentile move, and the top-10 list's fate."""
    import numpy as np

    rows = []
    for metric in sorted(set(reference.index.get_level_values("metric"))):
        ref, got = reference.xs(metric, level="metric"), other.xs(metric, level="metric")
        diff = (got - ref).abs().dropna().to_numpy()
        top_ref, top_got = _top10(ref.dropna()), _top10(got.dropna())
        lost = len(set(top_ref) - set(top_got))
        fate = "same" if top_ref == top_got else ("reordered" if not lost else
                                                  f"changed: {lost} of 10")
        rows.append({"metric": metric, "max_abs": float(diff.max()) if len(diff) else 0.0,
                     "p99_abs": float(np.percentile(diff, 99)) if len(diff) else 0.0,
                     "top10": fate, "top10_lost": lost})
    return rows


def safe(rows_by_model: dict[str, list[dict]]) -> dict[str, bool]:
    """Per experiment: every score it reports within :data:`SAFE` on every model, and no
    top-10 list losing a head."""
    verdict = {}
    for experiment, wanted in EXPERIMENT_METRICS.items():
        ok = True
        for rows in rows_by_model.values():
            for row in rows:
                if not any(row["metric"] == w or (w.endswith("*") and row["metric"]
                           .startswith(w[:-1])) for w in wanted):
                    continue
                bound = SAFE.get(row["metric"], DEFAULT_SAFE)
                ok &= row["max_abs"] <= bound and row["top10_lost"] == 0
        verdict[experiment] = ok
    return verdict


def measure(models: list[str], dtypes: list[str], sizes=(N_PROMPTS, N_TOKENS, SEQ_LEN)
            ) -> dict:
    """The whole table: ``{dtype: {model: rows}}``, the verdicts and the scan times."""
    out: dict = {"sizes": list(sizes), "table": {}, "safe": {}, "seconds": {}}
    for name in models:
        reference, seconds = head_scores(name, "float32", sizes)
        out["seconds"][f"{name}/float32"] = seconds
        for dtype in dtypes:
            scores, seconds = head_scores(name, dtype, sizes)
            out["seconds"][f"{name}/{dtype}"] = seconds
            out["table"].setdefault(dtype, {})[name] = compare(reference, scores)
    for dtype, rows in out["table"].items():
        out["safe"][dtype] = safe(rows)
    return out


def markdown(result: dict) -> str:
    """The table as docs/performance.md shows it: one row per metric, both models side by
    side."""
    lines = []
    for dtype, by_model in result["table"].items():
        models = list(by_model)
        lines.append(f"| {dtype}: metric | " + " | ".join(
            f"{m} max / p99 / top 10" for m in models) + " |")
        lines.append("|---|" + "---|" * len(models))
        metrics = sorted({r["metric"] for rows in by_model.values() for r in rows})
        for metric in metrics:
            cells = []
            for m in models:
                row = next((r for r in by_model[m] if r["metric"] == metric), None)
                cells.append("n/a" if row is None else
                             f"{row['max_abs']:.2g} / {row['p99_abs']:.2g} / {row['top10']}")
            lines.append(f"| {metric} | " + " | ".join(cells) + " |")
        verdicts = ", ".join(f"{k}: {'safe' if v else 'not safe'}"
                             for k, v in result["safe"][dtype].items())
        lines += ["", f"{dtype}: {verdicts}", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="smollm2,minilm")
    parser.add_argument("--dtypes", default=",".join(DTYPES))
    parser.add_argument("--smoke", action="store_true",
                        help="2 prompts of 16 tokens, on --models (local folders)")
    parser.add_argument("--markdown", action="store_true",
                        help="print the table of docs/performance.md")
    parser.add_argument("--json", action="store_true", help="print JSON only")
    args = parser.parse_args()
    sizes = (2, 16, 4) if args.smoke else (N_PROMPTS, N_TOKENS, SEQ_LEN)
    result = measure(args.models.split(","), args.dtypes.split(","), sizes)
    if args.json:
        print(json.dumps(result, indent=2))
    elif args.markdown:
        print(markdown(result))
    else:
        print(markdown(result))
        print(json.dumps(result["seconds"], indent=2))


if __name__ == "__main__":
    main()
