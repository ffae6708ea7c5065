"""Speed and memory of loading, forward passes, pattern reduction and recording.

Each measurement runs in its own subprocess, so that its peak RSS is its own:

- load: first and repeat ``load_model`` of smollm2 and minilm in a fresh process, and what
  loading the GGUF directly (without the cached safetensors) would cost;
- throughput: tokens/s on the same batch of natural text (8 x 128 tokens) for the
  workbench's pattern-reduction scan (``reduce_patterns`` of head-overview's four
  statistics, blocked attention, nothing stored) against a hand-written plain Hugging Face
  scan (eager attention, ``output_attentions``, the same four statistics from the returned
  patterns), the bridge's ``run_with_cache`` of every pattern, and the SDPA forward; each
  in float32 and in bfloat16. The Hugging Face variants run the model body
  (``model.model``), as the scan stops after the last block; ``run_with_cache`` runs the
  whole bridge, as a user calls it. In each of ``--processes`` fresh processes every
  variant runs once per round, each round starting one variant later; the rounds of all
  processes are pooled: tokens/s are medians, and each ratio is the median of the ratios
  within a round (two variants of one round ran seconds apart, so a drifting machine moves
  both alike). A process's allocator settles early into a state that favours some
  variants, so each ratio's median per process is printed beside it;
- record: ``workbench.recording.writer.record`` of 100 prompts of 128 tokens on smollm2, with
  tokens/s, bytes written and peak RSS.

``--smoke`` runs every part at a tiny size on ``--model`` (a local folder), in one process,
so that a benchmark that no longer runs fails the tests (``tests/unit/test_benchmarks.py``).

Usage:
    python benchmarks/recording.py [--repeats 5] [--prompts 100] [--tokens 128] [--json]
    python benchmarks/recording.py --parts throughput --repeats 8 --processes 4
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DTYPES = ("float32", "bfloat16")


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def part_load(args: argparse.Namespace) -> dict:
    start = time.perf_counter()
    import torch  # noqa: F401
    import transformer_lens  # noqa: F401
    import transformers  # noqa: F401

    imports = time.perf_counter() - start
    from workbench.models import cache, zoo
    from workbench.models.load import load_model

    out = {"import_s": imports}
    for name in [args.model] if args.smoke else ["smollm2", "minilm"]:
        t0 = time.perf_counter()
        load_model(name)
        t1 = time.perf_counter()
        load_model(name)
        out[f"{Path(name).name}_first_s"] = t1 - t0
        out[f"{Path(name).name}_repeat_s"] = time.perf_counter() - t1
    if args.smoke:
        return out
    from transformers import AutoModelForCausalLM

    gguf = cache.model_dir("smollm2") / zoo.MODELS.get("smollm2").weights.file
    t0 = time.perf_counter()
    AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    out["smollm2_gguf_direct_s"] = time.perf_counter() - t0
    return out


def _batch(model, n_prompts: int, n_tokens: int):
    from workbench.inputs.corpus import python_docs, token_chunks

    return token_chunks(model, python_docs(), n_chunks=n_prompts, n_tokens=n_tokens)


def _hand_scan(body, ids) -> list:
    """What a user writes by hand: Hugging Face's eager patterns, and head-overview's four
    statistics (mean entropy, normalized entropy, distance, self-attention) from them."""
    import torch

    out = body(ids, output_attentions=True)
    n = ids.shape[1]
    q, k = torch.arange(n)[:, None], torch.arange(n)[None, :]
    dist, log_visible = (q - k).abs().float(), torch.arange(1, n + 1).float().log()
    scores = []
    for pattern in out.attentions:
        p = pattern.float()
        h = -(p * p.clamp_min(1e-30).log()).sum(-1)
        scores.append((h.mean(-1), (h[..., 1:] / log_visible[1:]).mean(-1),
                       (p * dist).sum(-1).mean(-1), p.diagonal(dim1=-2, dim2=-1).mean(-1)))
    return scores


def _scans(args: argparse.Namespace, dtype: str, prompts, ids) -> dict:
    """The four variants of one dtype, each a function of no arguments."""
    import torch
    from transformers import AutoModelForCausalLM

    from experiments.head_overview import REDUCTIONS
    from workbench.models import cache
    from workbench.models.load import load_model
    from workbench.recording import hooks
    from workbench.recording.reductions import reduce_patterns

    model = load_model(args.model, dtype=dtype)
    folder = args.model if args.smoke else str(cache.hf_dir(args.model))
    torch_dtype = getattr(torch, dtype)
    eager = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager",
                                                 dtype=torch_dtype).eval()
    sdpa = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="sdpa",
                                                dtype=torch_dtype).eval()
    names = [hooks.pattern(layer) for layer in range(model.info.n_layers)]
    n = ids.numel()
    return {
        f"{dtype}/reduce": lambda: reduce_patterns(model, prompts, REDUCTIONS,
                                                   max_batch_tokens=n),
        f"{dtype}/hand_eager": lambda: _hand_scan(eager.model, ids),
        f"{dtype}/run_with_cache": lambda: model.bridge.run_with_cache(ids, names_filter=names),
        f"{dtype}/sdpa": lambda: sdpa.model(ids),
    }


def part_throughput(args: argparse.Namespace) -> dict:
    """One process's rounds: every variant's time in each round, in seconds."""
    import torch

    from workbench.models.load import load_model

    torch.set_grad_enabled(False)
    prompts = _batch(load_model(args.model), args.batch, args.tokens)
    ids = torch.tensor([p.token_ids for p in prompts])
    scans = {}
    for dtype in DTYPES:
        scans |= _scans(args, dtype, prompts, ids)
    times: dict[str, list[float]] = {name: [] for name in scans}
    for fn in scans.values():
        fn()  # warm-up
    names = list(scans)
    for r in range(args.repeats):  # round by round: every variant sees the same load
        # each round starts one variant later, so each takes every place in the order
        # alike (what ran just before a variant, the allocator's state, moves its time)
        for name in names[r % len(names):] + names[:r % len(names)]:
            t0 = time.perf_counter()
            scans[name]()
            times[name].append(time.perf_counter() - t0)
    return {"batch": list(ids.shape), "threads": torch.get_num_threads(), "times": times,
            "peak_rss_mib": peak_rss_mib()}


def summarize_throughput(runs: list[dict]) -> dict:
    """Tokens/s and ratios over the rounds of every process.

    A ratio is the median over rounds of the ratio within a round (two variants of one
    round ran seconds apart, so a machine whose speed drifts moves both alike); the
    processes differ more than the rounds of one (the allocator's state is set early in
    a process), so each ratio's median per process is shown beside it.
    """
    n_tokens = runs[0]["batch"][0] * runs[0]["batch"][1]
    pooled = {name: [t for run in runs for t in run["times"][name]] for name in runs[0]["times"]}
    out: dict = {"batch": runs[0]["batch"], "threads": runs[0]["threads"],
                 "processes": len(runs), "rounds": len(pooled["float32/reduce"]),
                 "peak_rss_mib": max(run["peak_rss_mib"] for run in runs),
                 **{f"{k}_tok_s": n_tokens / statistics.median(t) for k, t in pooled.items()}}

    def ratio(times: dict, fast: str, slow: str) -> float:
        return statistics.median(b / a for a, b in zip(times[fast], times[slow], strict=True))

    pairs = {f"{dtype}/reduce_vs_{other}": (f"{dtype}/reduce", f"{dtype}/{other}")
             for dtype in DTYPES for other in ("hand_eager", "run_with_cache", "sdpa")}
    pairs |= {"reduce_bf16_vs_float32": ("bfloat16/reduce", "float32/reduce"),
              "sdpa_bf16_vs_float32": ("bfloat16/sdpa", "float32/sdpa")}
    for key, (fast, slow) in pairs.items():
        out[key] = ratio(pooled, fast, slow)
        out[f"{key}_per_process"] = " ".join(f"{ratio(run['times'], fast, slow):.2f}"
                                             for run in runs)
    return out


def part_record(args: argparse.Namespace) -> dict:
    from workbench.models.load import load_model
    from workbench.recording.writer import record

    model = load_model(args.model)
    prompts = _batch(model, args.prompts, args.tokens)
    rss_before = peak_rss_mib()
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        rec = record(model, prompts, Path(tmp) / "rec")
        seconds = time.perf_counter() - t0
        written = sum(f.stat().st_size for f in Path(tmp).rglob("*") if f.is_file())
        assert len(rec) == args.prompts
    return {"prompts": args.prompts, "tokens_per_prompt": args.tokens, "seconds": seconds,
            "tok_s": args.prompts * args.tokens / seconds, "written_mib": written / 2**20,
            "peak_rss_before_mib": rss_before, "peak_rss_mib": peak_rss_mib()}


PARTS = {"load": part_load, "throughput": part_throughput, "record": part_record}
SMOKE = {"repeats": 1, "processes": 1, "batch": 2, "prompts": 2, "tokens": 16}
"""The tiny sizes of ``--smoke``."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=PARTS, help=argparse.SUPPRESS)
    parser.add_argument("--parts", default=",".join(PARTS), help="comma-separated parts")
    parser.add_argument("--model", default="smollm2", help="the model (default smollm2)")
    parser.add_argument("--repeats", type=int, default=5, help="throughput: rounds per process")
    parser.add_argument("--processes", type=int, default=3,
                        help="throughput: fresh processes, each running every round")
    parser.add_argument("--batch", type=int, default=8, help="prompts per throughput batch")
    parser.add_argument("--prompts", type=int, default=100, help="prompts to record")
    parser.add_argument("--tokens", type=int, default=128, help="tokens per prompt")
    parser.add_argument("--smoke", action="store_true",
                        help="every part at a tiny size on --model (a local folder)")
    parser.add_argument("--json", action="store_true", help="print JSON only")
    args = parser.parse_args()
    if args.smoke:
        vars(args).update(SMOKE)
    if args.part:
        result = PARTS[args.part](args)
        result["peak_rss_mib"] = result.get("peak_rss_mib", peak_rss_mib())
        print(json.dumps(result))
        return
    results = {}
    for part in args.parts.split(","):
        runs = []
        for _ in range(args.processes if part == "throughput" else 1):
            if args.smoke:  # tiny sizes: every part in this process
                runs.append(PARTS[part](args))
                continue
            cmd = [sys.executable, __file__, "--part", part, *sys.argv[1:]]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                sys.exit(f"part {part} failed:\n{proc.stderr}")
            runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        results[part] = summarize_throughput(runs) if part == "throughput" else runs[0]
    if args.json:
        print(json.dumps(results, indent=2))
        return
    for part, values in results.items():
        print(f"[{part}]")
        for key, value in values.items():
            shown = f"{value:,.2f}" if isinstance(value, float) else value
            print(f"  {key:34s} {shown}")


if __name__ == "__main__":
    main()
