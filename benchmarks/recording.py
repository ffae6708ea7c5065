"""Speed and memory of loading, forward passes, pattern reduction and recording.

Each measurement runs in its own subprocess, so that its peak RSS is its own:

- load: first and repeat ``load_model`` of smollm2 and minilm in a fresh process, and what
  loading the GGUF directly (without the cached safetensors) would cost;
- throughput: tokens/s on the same batch of natural text for a plain Hugging Face forward
  (eager attention, and SDPA for reference), the bridge's forward, and the workbench's
  pattern-reduction path (``workbench.recording.reductions.reduce_patterns``, nothing stored);
- record: ``workbench.recording.record`` of 100 prompts of 128 tokens on smollm2, with
  tokens/s, bytes written and peak RSS.

Usage:
    python benchmarks/recording.py [--repeats 5] [--prompts 100] [--tokens 128] [--json]
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
    for name in ("smollm2", "minilm"):
        t0 = time.perf_counter()
        load_model(name)
        t1 = time.perf_counter()
        load_model(name)
        out[f"{name}_first_s"] = t1 - t0
        out[f"{name}_repeat_s"] = time.perf_counter() - t1
    from transformers import AutoModelForCausalLM

    gguf = cache.model_dir("smollm2") / zoo.MODELS.get("smollm2").weights.file
    t0 = time.perf_counter()
    AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    out["smollm2_gguf_direct_s"] = time.perf_counter() - t0
    return out


def _batch(model, n_prompts: int, n_tokens: int):
    from workbench.inputs.corpus import python_docs, token_chunks

    return token_chunks(model, python_docs(), n_chunks=n_prompts, n_tokens=n_tokens)


def _rate(fn, n_tokens: int, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return n_tokens / statistics.median(times)


def part_throughput(args: argparse.Namespace) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from experiments.head_overview import REDUCTIONS
    from workbench.models import cache
    from workbench.models.load import load_model
    from workbench.recording.reductions import reduce_patterns

    torch.set_grad_enabled(False)
    model = load_model("smollm2")
    prompts = _batch(model, args.batch, args.tokens)
    ids = torch.tensor([p.token_ids for p in prompts])
    n = ids.numel()
    folder = str(cache.hf_dir("smollm2"))
    eager = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    sdpa = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="sdpa").eval()
    out = {
        "batch": list(ids.shape),
        "threads": torch.get_num_threads(),
        "hf_eager_tok_s": _rate(lambda: eager(ids), n, args.repeats),
        "hf_sdpa_tok_s": _rate(lambda: sdpa(ids), n, args.repeats),
        "bridge_tok_s": _rate(lambda: model.bridge(ids), n, args.repeats),
        "reduce_tok_s": _rate(
            lambda: reduce_patterns(model, prompts, REDUCTIONS, max_batch_tokens=n), n,
            args.repeats),
    }
    out["reduce_vs_hf_eager"] = out["reduce_tok_s"] / out["hf_eager_tok_s"]
    out["bridge_vs_hf_eager"] = out["bridge_tok_s"] / out["hf_eager_tok_s"]
    return out


def part_record(args: argparse.Namespace) -> dict:
    from workbench.models.load import load_model
    from workbench.recording.record import record

    model = load_model("smollm2")
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=PARTS, help=argparse.SUPPRESS)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batch", type=int, default=8, help="prompts per throughput batch")
    parser.add_argument("--prompts", type=int, default=100, help="prompts to record")
    parser.add_argument("--tokens", type=int, default=128, help="tokens per prompt")
    parser.add_argument("--json", action="store_true", help="print JSON only")
    args = parser.parse_args()
    if args.part:
        result = PARTS[args.part](args)
        result["peak_rss_mib"] = result.get("peak_rss_mib", peak_rss_mib())
        print(json.dumps(result))
        return
    results = {}
    for part in PARTS:
        cmd = [sys.executable, __file__, "--part", part, *sys.argv[1:]]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
        results[part] = json.loads(proc.stdout.strip().splitlines()[-1])
    if args.json:
        print(json.dumps(results, indent=2))
        return
    for part, values in results.items():
        print(f"[{part}]")
        for key, value in values.items():
            shown = f"{value:,.2f}" if isinstance(value, float) else value
            print(f"  {key:24s} {shown}")


if __name__ == "__main__":
    main()
