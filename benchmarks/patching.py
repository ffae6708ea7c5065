"""Activation patching of a layers x positions grid on smollm2: the workbench's batched,
replayed grid against a hand-written TransformerLens-hook loop doing the same patches.

Both patch the clean residual stream (``hook_resid_pre``) of every layer at every position
into the corrupted run of the same prompts (the reference: 30 layers x 20 positions, 4
prompts of 20 tokens: IOI prompts of template 1, "Then, [A] and [B] had a lot of fun at
the [PLACE]. [B] gave a [OBJECT] to", whose ABC twins have the three names replaced), and read the
logit difference IO - S at the last position. The loop is what TransformerLens' patching
tutorial writes: the clean activations from ``run_with_cache``, then one ``run_with_hooks``
of the corrupted batch per (layer, position), its hook overwriting that position and the
logits read from the full output. Both run in this process, one after the other, after a
warm-up pass; the values must agree (``max_abs_diff``). ``tokens_per_s`` counts the tokens
of the patched runs (cells x prompts x tokens) per second of wall time, the clean and
corrupted reference passes included.

Usage:
    python benchmarks/patching.py [--layers 30] [--positions 20] [--prompts 4] [--json]
    python benchmarks/patching.py --smoke MODEL_FOLDER   # the tests' tiny run
"""

from __future__ import annotations

import argparse
import json
import os
import time


def _pair(model, n_prompts: int, positions: int, smoke: bool):
    """Clean and corrupted ids of ``n_prompts`` equal-length prompts, ``positions`` long."""
    import torch

    from workbench.interventions.patching import Pair
    from workbench.scores.logit_attribution import Contrast

    if smoke:  # the tiny tokenizer has no single-token names: random ids, three changed
        gen = torch.Generator().manual_seed(0)
        clean = torch.randint(10, 290, (n_prompts, positions), generator=gen)
        corrupted = clean.clone()
        corrupted[:, [1, 3]] = torch.randint(10, 290, (n_prompts, 2), generator=gen)
        contrast = Contrast(clean[:, 1], clean[:, 3])
        return Pair(clean, corrupted, contrast, torch.full((n_prompts,), positions - 1))
    from experiments.ioi.measure import pair_of
    from workbench.inputs.ioi import ioi_prompts

    prompts = [p for p in ioi_prompts(model, 2 * n_prompts, templates=[1], seed=0)
               if p.order == "ABBA"][:n_prompts]
    pair = pair_of(prompts)
    width = pair.clean.shape[1]
    if width != positions:
        raise SystemExit(f"the prompts have {width} tokens, not {positions}")
    return pair


def workbench_grid(model, pair, layers: list[int]):
    from workbench.interventions.patching import patch_grid

    cells = list(range(pair.clean.shape[1]))
    return patch_grid(model, pair, "resid_pre", layers=layers, cells=cells).values


def hook_loop(model, pair, layers: list[int]):
    """What a TransformerLens user writes by hand."""
    import numpy as np
    import torch

    bridge = model.bridge
    rows = torch.arange(pair.clean.shape[0])
    names = [f"blocks.{layer}.hook_resid_pre" for layer in layers]
    _, cache = bridge.run_with_cache(pair.clean, names_filter=lambda name: name in names)
    width = pair.clean.shape[1]
    out = np.zeros((len(rows), len(layers), width))
    for li, name in enumerate(names):
        for pos in range(width):
            def hook(resid, hook, pos=pos, name=name):
                resid[:, pos] = cache[name][:, pos]
                return resid
            logits = bridge.run_with_hooks(pair.corrupted, fwd_hooks=[(name, hook)])
            at = logits[rows, pair.positions]
            out[:, li, pos] = (at[rows, pair.contrast.answer]
                               - at[rows, pair.contrast.other]).double().numpy()
    return out


def measure(model_name: str, n_layers: int | None, positions: int, n_prompts: int,
            smoke: bool) -> dict:
    import numpy as np
    import torch

    from workbench.models.load import load_model

    model = load_model(model_name)
    layers = list(range(n_layers or model.info.n_layers))
    pair = _pair(model, n_prompts, positions, smoke)
    with torch.inference_mode():
        model.bridge(pair.clean, return_type=None)  # warm-up
        timed = {}
        for name, fn in (("workbench", workbench_grid), ("hook loop", hook_loop)):
            start = time.perf_counter()
            timed[name] = (fn(model, pair, layers), time.perf_counter() - start)
    tokens = len(layers) * positions * n_prompts * positions
    (ours, t_ours), (theirs, t_theirs) = timed["workbench"], timed["hook loop"]
    load = [f"{x:.2f}" for x in os.getloadavg()]
    return {"model": model.info.name, "layers": len(layers), "positions": positions,
            "prompts": n_prompts, "torch_threads": torch.get_num_threads(),
            "workbench_s": round(t_ours, 2), "hook_loop_s": round(t_theirs, 2),
            "workbench_tokens_per_s": round(tokens / t_ours, 1),
            "hook_loop_tokens_per_s": round(tokens / t_theirs, 1),
            "speedup": round(t_theirs / t_ours, 2),
            "max_abs_diff": float(np.abs(ours - theirs).max()), "loadavg": " ".join(load)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--layers", type=int, default=None, help="first N layers (default all)")
    parser.add_argument("--positions", type=int, default=20)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--json", action="store_true", help="print JSON, not a table")
    parser.add_argument("--smoke", metavar="MODEL", help="2 layers x 6 positions of 2 random "
                        "prompts on MODEL (a local folder): the benchmark still runs")
    args = parser.parse_args()
    if args.smoke:
        print(json.dumps(measure(args.smoke, 2, 6, 2, smoke=True)))
        return
    r = measure(args.model, args.layers, args.positions, args.prompts, smoke=False)
    if args.json:
        print(json.dumps(r))
        return
    print(f"{r['layers']} layers x {r['positions']} positions x {r['prompts']} prompts on "
          f"{r['model']} ({r['torch_threads']} torch threads, load {r['loadavg']})")
    print(f"{'':10} {'seconds':>8} {'tokens/s':>9}")
    print(f"{'workbench':10} {r['workbench_s']:>8.1f} {r['workbench_tokens_per_s']:>9.1f}")
    print(f"{'hook loop':10} {r['hook_loop_s']:>8.1f} {r['hook_loop_tokens_per_s']:>9.1f}")
    print(f"speedup {r['speedup']:.2f}x; values agree within {r['max_abs_diff']:.1e}")


if __name__ == "__main__":
    main()
