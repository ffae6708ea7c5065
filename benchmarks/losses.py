"""Next-token losses and copying scores on a large vocabulary: the workbench's, which never
form the logits, against the plain computation from every logit.

Losses: :func:`workbench.scores.losses.token_losses` (the pass stops at the final norm and
the vocabulary is unembedded 4,096 entries at a time) against the bridge's whole logits
and ``F.cross_entropy`` of their rows, on ``repeated-random`` prompts (40 tokens three
times, 121 with BOS) and on 512-token windows of the Python docs' prose. Both run
``--repeats`` times, interleaved, after a warm-up; the median seconds are reported, with
each one's largest error from the same loss in float64 (``float64_error``).

Copying scores: :func:`workbench.scores.heads.copying_scores` (each z-score's mean and
spread over the vocabulary from the unembedding's column covariance) against every logit
formed and ``(own - mean) / std`` taken over them, on every head for ``--tokens`` random
token ids; ``max_abs_diff`` is the largest difference of a z-score.

Usage:
    python benchmarks/losses.py [--model gemma3] [--repeats 3] [--tokens 200] [--json]
    python benchmarks/losses.py --smoke MODEL_FOLDER   # the tests' tiny run
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time


def whole_logit_losses(model, prompts) -> list:
    """Each prompt's losses from the bridge's whole logits, one prompt at a time."""
    import torch
    import torch.nn.functional as F

    out = []
    with torch.inference_mode():
        for prompt in prompts:
            ids = torch.tensor([prompt.token_ids])
            logits = model.bridge(ids)[0, :-1]
            out.append(F.cross_entropy(logits.float(), ids[0, 1:], reduction="none"))
    return out


def float64_losses(model, prompts) -> list:
    """The reference: the final norm's output unembedded in float64."""
    import torch
    import torch.nn.functional as F

    from workbench.inputs.batching import Batch
    from workbench.recording import hooks
    from workbench.scores.logit_attribution import output_transform, unembed_bias

    w_u, b_u = model.bridge.W_U.double(), unembed_bias(model)
    out = []
    with torch.inference_mode():
        for prompt in prompts:
            ids = torch.tensor([prompt.token_ids])
            normed = hooks.capture(model, Batch.of(ids), [hooks.FINAL_OUT])[hooks.FINAL_OUT]
            logits = normed[0, :-1].double() @ w_u + (0 if b_u is None else b_u.double())
            logits = output_transform(model, logits)
            out.append(F.cross_entropy(logits, ids[0, 1:], reduction="none"))
    return out


def all_logit_copying(model, tokens):
    """Copying z-scores with every logit formed (the definition, term by term)."""
    import einops
    import torch

    from workbench.scores import heads

    bridge, info = model.bridge, model.info
    out = torch.empty(len(tokens), info.n_layers, info.n_heads)
    with torch.inference_mode():
        w_e, w_u = bridge.W_E, bridge.W_U
        w_v_all, w_o_all, b_v_all = bridge.W_V, bridge.W_O, heads._value_bias(bridge, info)
        final_bias = bridge.ln_final(torch.zeros(1, info.d_model))
        kv = torch.tensor([heads._kv_index(model, h) for h in range(info.n_heads)])
        for layer in range(info.n_layers):
            w_v = w_v_all[layer][kv] if w_v_all.shape[1] != info.n_heads else w_v_all[layer]
            b_v = b_v_all[layer][kv] if b_v_all.shape[1] != info.n_heads else b_v_all[layer]
            for start in range(0, len(tokens), 64):
                t = tokens[start:start + 64]
                x = heads._first_norm(model, layer)(w_e[t])
                v = einops.einsum(x, w_v, "n d_model, head d_model d_head -> n head d_head")
                o = einops.einsum(v + b_v, w_o_all[layer],
                                  "n head d_head, head d_head d_model -> n head d_model")
                logits = (bridge.ln_final(o) - final_bias) @ w_u
                own = logits.gather(-1, t[:, None, None].expand(-1, info.n_heads, 1))[..., 0]
                out[start:start + 64, layer] = (own - logits.mean(-1)) / logits.std(-1)
    return out


def _timed(fn, repeats: int) -> tuple[object, float]:
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return result, statistics.median(times)


def _error(got: list, reference: list) -> float:
    return max(float((a.double() - b).abs().max()) for a, b in zip(got, reference, strict=True))


def measure_losses(model, prompts, label: str, repeats: int) -> dict:
    from workbench.scores.losses import token_losses

    token_losses(model, prompts[:1])  # warm-up
    times: dict[str, list[float]] = {"workbench": [], "whole logits": []}
    results = {}
    for _ in range(repeats):  # interleaved, so a slow spell of the machine hits both
        for name, fn in (("workbench", token_losses), ("whole logits", whole_logit_losses)):
            results[name], seconds = _timed(lambda fn=fn: fn(model, prompts), 1)
            times[name].append(seconds)
    exact = float64_losses(model, prompts)
    ours, theirs = (statistics.median(times[n]) for n in ("workbench", "whole logits"))
    return {"inputs": label, "tokens": sum(len(p.token_ids) for p in prompts),
            "workbench_s": round(ours, 2), "whole_logits_s": round(theirs, 2),
            "speedup": round(theirs / ours, 2),
            "workbench_float64_error": _error(results["workbench"], exact),
            "whole_logits_float64_error": _error(results["whole logits"], exact)}


def measure_copying(model, n_tokens: int) -> dict:
    import torch

    from workbench.scores.heads import copying_scores

    vocab = model.bridge.W_U.shape[1]
    margin = min(1000, vocab // 4)
    tokens = torch.randint(margin, vocab - margin, (n_tokens,),
                           generator=torch.Generator().manual_seed(0))
    ours, t_ours = _timed(lambda: copying_scores(model, tokens), 1)
    theirs, t_theirs = _timed(lambda: all_logit_copying(model, tokens), 1)
    return {"tokens": n_tokens, "workbench_s": round(t_ours, 2),
            "all_logits_s": round(t_theirs, 2), "speedup": round(t_theirs / t_ours, 1),
            "max_abs_diff": float((ours - theirs).abs().max())}


def measure(model_name: str, *, repeats: int, n_tokens: int, n_prompts: int,
            n_windows: int, smoke: bool) -> dict:
    import torch

    from workbench.inputs.corpus import python_docs, token_chunks
    from workbench.inputs.prompts import load_prompt_set
    from workbench.models.load import load_model

    model = load_model(model_name)
    repeated = load_prompt_set("repeated-random", model, n_prompts=n_prompts,
                               seq_len=8 if smoke else 40, repeats=3, seed=0)
    windows = token_chunks(model, python_docs(), n_chunks=n_windows,
                           n_tokens=32 if smoke else 512, label="docs")
    losses = [measure_losses(model, repeated, "repeated-random", repeats),
              measure_losses(model, windows, "docs windows", repeats)]
    return {"model": model.info.name, "d_vocab": int(model.bridge.W_U.shape[1]),
            "torch_threads": torch.get_num_threads(),
            "loadavg": " ".join(f"{x:.2f}" for x in os.getloadavg()),
            "losses": losses, "copying": measure_copying(model, n_tokens)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gemma3")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=200, help="copying-score tokens")
    parser.add_argument("--prompts", type=int, default=8, help="repeated-random prompts")
    parser.add_argument("--windows", type=int, default=4, help="512-token docs windows")
    parser.add_argument("--json", action="store_true", help="print JSON, not a table")
    parser.add_argument("--smoke", metavar="MODEL", help="a few short prompts and 8 tokens "
                        "on MODEL (a local folder): the benchmark still runs")
    args = parser.parse_args()
    if args.smoke:
        print(json.dumps(measure(args.smoke, repeats=1, n_tokens=8, n_prompts=2,
                                 n_windows=1, smoke=True)))
        return
    r = measure(args.model, repeats=args.repeats, n_tokens=args.tokens,
                n_prompts=args.prompts, n_windows=args.windows, smoke=False)
    if args.json:
        print(json.dumps(r))
        return
    print(f"{r['model']} (vocabulary {r['d_vocab']:,}; {r['torch_threads']} torch threads, "
          f"load {r['loadavg']})")
    print(f"{'losses':18} {'tokens':>6} {'workbench s':>11} {'whole s':>8} {'speedup':>7} "
          f"{'error (workbench / whole)':>26}")
    for row in r["losses"]:
        print(f"{row['inputs']:18} {row['tokens']:>6} {row['workbench_s']:>11.2f} "
              f"{row['whole_logits_s']:>8.2f} {row['speedup']:>6.2f}x "
              f"{row['workbench_float64_error']:>12.1e} / {row['whole_logits_float64_error']:.1e}")
    c = r["copying"]
    print(f"copying scores, {c['tokens']} tokens x every head: {c['workbench_s']:.1f} s against "
          f"{c['all_logits_s']:.1f} s with every logit ({c['speedup']}x), z-scores within "
          f"{c['max_abs_diff']:.1e}")


if __name__ == "__main__":
    main()
