"""Head statistics on one GPU at 8B-model shapes: the fused kernel against SDPA and eager.

Speed does not depend on the weights, so every model here is built with random weights
from a published configuration written out below (:data:`SHAPES`: Llama-3.1-8B,
Qwen2.5-7B, and Gemma-3-4B with its five sliding-window layers to one global layer),
loaded straight onto the GPU in bfloat16, without downloads. Only the base model runs
(no language-model head: its ``[T, vocab]`` logits are no part of a scan).

The scan is the model's own forward pass with each layer's attention computed by the
fused kernel (:func:`workbench.models.fused.attention_statistics`, registered as a
transformers attention function), which also returns every head's per-query statistics
(weight on the first and the previous token, entropy, mean distance); their per-head means
are kept per layer, with no ``[head, T, T]`` tensor and no host synchronisation. For each
model it measures:

- ``throughput``: tokens/s of the scan, once per precision of the kernel's products
  (``tensor``: bfloat16 operands on the tensor cores, the default for bfloat16; ``ieee``:
  float32 operands), and of the same model's SDPA forward (FlashAttention where PyTorch
  picks it) at 8k, 32k and 128k tokens, one process, each ratio beside them (target: the
  scan at least 0.8x SDPA at 32k on the 8B shape). For the Gemma shape's
  sliding layers transformers builds SDPA a boolean ``[T, T]`` mask (16 GiB at 128k),
  and SDPA with a mask does not take its FlashAttention kernel: that is the baseline a
  user of transformers gets, and the scan builds no mask;
- ``memory``: the scan's peak GPU memory (``torch.cuda.max_memory_allocated``) against the
  weights' size (target at 128k: at most the weights plus 10 GiB);
- ``eager``: the shortest length, doubling from 4k, at which eager attention (the whole
  ``[head, T, T]`` pattern, what TransformerLens exposes) runs out of memory;
- ``exact``: on a two-layer model of the same shape in float32 (2,048 tokens; the Gemma
  shape keeps one sliding and one global layer), every per-query statistic and the last
  hidden state of the fused forward against eager attention's pattern (bound 1e-5 times
  ``max(1, |reference|)``);
- ``tensor - ieee``: on the same two-layer model in bfloat16, both precisions on each
  layer's same queries, keys and values: the largest difference of a statistic, in units
  of ``max(1, |ieee|)`` (they read the same float32 scores, so float32 rounding alone:
  bound 1e-5), and of the output relative to ``sum_j w_ij |v_j|`` (bound
  ``(1 + 2^-7)^3 - 1``: the weights' rounding to bfloat16 and both outputs' store; the
  derivation is in :mod:`workbench.models.fused`). Both checks, with ``exact``'s, set the
  exit status.

It prints a markdown table (``--json`` too). One command of at most 8 minutes on one
H100/H200: the throughput runs share a budget (``--budget``, default 360 s), and a length
whose time, predicted from the last one measured, would end past it is skipped and shown
as skipped; a forward that runs out of memory is shown as such. ``--smoke`` runs every
part on the CPU at tiny shapes under Triton's interpreter (``TRITON_INTERPRET=1``, set by
this script before triton is imported), the throughput model in bfloat16 as on the GPU,
so that ``tests/unit/test_benchmarks.py`` checks that both precisions run (the bfloat16
tensor path as the interpreter emulates it); its timings mean nothing.

Dependencies: torch, transformers and triton, and of the workbench only
``workbench/models/fused`` (which needs jaxtyping): the script imports that package
without ``workbench.models``' own imports (TransformerLens, the bridge), so the device
needs no bundled model and little of the project.

Usage:
    python benchmarks/gpu.py                          # every model and part, on cuda:0
    python benchmarks/gpu.py --models llama-3.1-8b --lengths 8192,32768
    python benchmarks/gpu.py --smoke                  # CPU, tiny shapes, interpreter
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import platform
import sys
import time
import types
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
LENGTHS = (8192, 32768, 131072)
EAGER_FROM, EAGER_TO = 4096, 131072
EXACT_TOKENS, EXACT_BOUND = 2048, 1e-5
BUDGET_S = 360.0
"""Seconds the throughput runs of every model may take, so that the whole command (model
builds, eager's search and the exactness checks besides) ends within 8 minutes."""
PRECISIONS = ("tensor", "ieee")
"""The kernel's precisions, each timed as its own attention implementation."""
FUSED = {precision: f"workbench_fused_{precision}" for precision in PRECISIONS}
GAP_STAT_BOUND, GAP_OUTPUT_BOUND = 1e-5, (1 + 2.0 ** -7) ** 3 - 1
"""The two precisions on the same bfloat16 inputs: statistics (the same float32 scores),
and the output relative to ``sum_j w_ij |v_j|`` (the weights rounded to bfloat16 before
``p . v``, and each run's output rounded once on the store)."""
STATS = ("first", "previous", "entropy", "distance")

# The published configurations (each model's config.json on the Hugging Face Hub),
# written out so the benchmark downloads nothing.
SHAPES: dict[str, dict[str, Any]] = {
    "llama-3.1-8b": {
        "class": "LlamaConfig", "hidden_size": 4096, "intermediate_size": 14336,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
        "vocab_size": 128256, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0, "rope_scaling": {
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}},
    "qwen2.5-7b": {
        "class": "Qwen2Config", "hidden_size": 3584, "intermediate_size": 18944,
        "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
        "vocab_size": 152064, "max_position_embeddings": 131072, "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0, "use_sliding_window": False},
    "gemma-3-4b": {
        "class": "Gemma3TextConfig", "hidden_size": 2560, "intermediate_size": 10240,
        "num_hidden_layers": 34, "num_attention_heads": 8, "num_key_value_heads": 4,
        "head_dim": 256, "vocab_size": 262208, "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-6, "sliding_window": 1024, "query_pre_attn_scalar": 256,
        "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
        "rope_scaling": {"rope_type": "linear", "factor": 8.0},
        "layer_types": [("full_attention" if (i + 1) % 6 == 0 else "sliding_attention")
                        for i in range(34)]},
}
SMOKE_SIZES = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
               "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 512,
               "sliding_window": 16, "query_pre_attn_scalar": 16}


# ---- the models -----------------------------------------------------------------------------

def config(name: str, *, layers: int | None = None, smoke: bool = False) -> Any:
    """The transformers config of shape ``name`` (``layers``: only that many; ``smoke``:
    tiny widths, the same kinds of layer)."""
    import transformers

    fields = {k: v for k, v in SHAPES[name].items() if k != "class"}
    if smoke:
        fields.update({k: v for k, v in SMOKE_SIZES.items()
                       if k in fields or k in ("head_dim", "num_key_value_heads")})
        fields["num_hidden_layers"] = 2
    if layers is not None:
        fields["num_hidden_layers"] = layers
    if "layer_types" in fields:
        n = fields["num_hidden_layers"]
        fields["layer_types"] = (fields["layer_types"][:n] if n > 2 else
                                 ["sliding_attention", "full_attention"][:n])
    cfg = getattr(transformers, SHAPES[name]["class"])(**fields)
    cfg._attn_implementation = "sdpa"
    return cfg


def build(cfg: Any, device: str, dtype: Any) -> Any:
    """The base model of ``cfg`` with random weights, made on ``device`` in ``dtype``."""
    import torch
    import transformers

    saved = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = transformers.AutoModel.from_config(cfg)
    finally:
        torch.set_default_dtype(saved)
    return model.eval().requires_grad_(False)


def weight_bytes(model: Any) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


# ---- the fused scan as a transformers attention function ------------------------------------

def kernel_module() -> types.ModuleType:
    """``workbench.models.fused`` without running ``workbench/models/__init__.py`` (which
    imports TransformerLens and the model loaders): the package's folder is named as the
    parent so that only the kernel's own modules load."""
    sys.path.insert(0, str(ROOT))
    import workbench  # noqa: F401  (its __init__ imports nothing heavy)

    if "workbench.models" not in sys.modules:
        parent = types.ModuleType("workbench.models")
        parent.__path__ = [str(ROOT / "workbench" / "models")]
        sys.modules["workbench.models"] = parent
    return importlib.import_module("workbench.models.fused")


class Scan:
    """Per-layer, per-head means of the kernel's statistics, kept on the device; with
    ``keep``, every layer's whole :class:`Statistics` too (for the exactness check)."""

    def __init__(self, fused: types.ModuleType, keep: bool = False,
                 precision: str | None = None) -> None:
        self.fused, self.keep, self.precision = fused, keep, precision
        self.means: dict[int, Any] = {}
        self.kept: dict[int, Any] = {}

    def attention(self, module: Any, query: Any, key: Any, value: Any, attention_mask: Any,
                  scaling: float | None = None, dropout: float = 0.0,
                  sliding_window: int | None = None, softcap: float | None = None,
                  **kwargs: Any) -> tuple[Any, None]:
        import torch

        variant = self.fused.Variant(causal=True, window=sliding_window, scale=scaling,
                                     softcap=softcap)
        stats = self.fused.attention_statistics(query, key, value, variant, received=False,
                                                precision=self.precision)
        layer = int(getattr(module, "layer_idx", len(self.means)))
        self.means[layer] = torch.stack([getattr(stats, s).mean(-1) for s in STATS])
        if self.keep:
            self.kept[layer] = stats
        return stats.output.transpose(1, 2).contiguous(), None


class Gap(Scan):
    """Both precisions on each layer's same queries, keys and values (a bfloat16 model):
    the largest statistic difference (units of ``max(1, |ieee|)``) and output difference
    (relative to ``sum_j w_ij |v_j|``, from the ieee run's weights) seen; the forward
    goes on with the tensor run's output."""

    def __init__(self, fused: types.ModuleType) -> None:
        super().__init__(fused)
        self.stats_gap, self.output_gap = 0.0, 0.0

    def attention(self, module: Any, query: Any, key: Any, value: Any, attention_mask: Any,
                  scaling: float | None = None, dropout: float = 0.0,
                  sliding_window: int | None = None, softcap: float | None = None,
                  **kwargs: Any) -> tuple[Any, None]:
        variant = self.fused.Variant(causal=True, window=sliding_window, scale=scaling,
                                     softcap=softcap)
        runs = {p: self.fused.attention_statistics(query, key, value, variant, received=False,
                                                   precision=p) for p in PRECISIONS}
        tensor, ieee = runs["tensor"], runs["ieee"]
        for stat in STATS:
            self.stats_gap = max(self.stats_gap, _relative(getattr(tensor, stat),
                                                           getattr(ieee, stat)))
        weights = _weights(query, key, ieee.lse, variant)
        group = query.shape[1] // key.shape[1]
        size = weights @ value.float().abs().repeat_interleave(group, 1)
        error = (tensor.output.float() - ieee.output.float()).abs() / size.clamp_min(1e-30)
        self.output_gap = max(self.output_gap, float(error.max()))
        return tensor.output.transpose(1, 2).contiguous(), None


def _weights(query: Any, key: Any, lse: Any, variant: Any) -> Any:
    """Every weight ``[batch, head, T, T]`` of a causal (windowed, capped) layer from its
    scores and the kernel's lse (small models only)."""
    import torch

    group = query.shape[1] // key.shape[1]
    q, k = query.float(), key.float().repeat_interleave(group, 1)
    scale = variant.scale if variant.scale is not None else q.shape[-1] ** -0.5
    s = q @ k.transpose(-1, -2) * scale
    if variant.softcap is not None:
        s = variant.softcap * torch.tanh(s / variant.softcap)
    i = torch.arange(s.shape[-1], device=s.device)
    seen = i[None, :] <= i[:, None]
    if variant.window is not None:
        seen &= i[None, :] > i[:, None] - variant.window
    return torch.where(seen, (s - lse[..., None]).exp(), 0.0)


def register(scan: Scan, name: str) -> None:
    """Name ``name`` in transformers' attention and mask interfaces: the kernel builds
    its own causal and sliding mask, so the mask builder builds none."""
    from transformers.masking_utils import AttentionMaskInterface
    from transformers.modeling_utils import AttentionInterface

    AttentionInterface.register(name, scan.attention)
    AttentionMaskInterface.register(name, lambda *args, **kwargs: None)


@contextmanager
def implementation(model: Any, name: str):
    """Run ``model``'s attention through ``name`` inside the block."""
    saved = model.config._attn_implementation
    model.config._attn_implementation = name
    try:
        yield
    finally:
        model.config._attn_implementation = saved


# ---- the measurements -----------------------------------------------------------------------

def sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed_forward(model: Any, ids: Any, device: str) -> tuple[float, float | None]:
    """Seconds of one forward pass of ``ids`` and its peak GPU memory in bytes (``None``
    on CPU)."""
    import torch

    if device.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    sync(device)
    start = time.perf_counter()
    with torch.inference_mode():
        model(input_ids=ids, use_cache=False)
    sync(device)
    seconds = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated() if device.startswith("cuda") else None
    return seconds, peak


def throughput(model: Any, length: int, device: str, seed: int = 0) -> dict[str, Any]:
    """The SDPA forward and the scan in each precision at ``length`` tokens: tokens/s,
    each scan's ratio to SDPA, peak GPU memory (``None`` for a forward that ran out of
    memory)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.config.vocab_size, (1, length), generator=gen).to(device)
    sdpa_s, sdpa_peak = _unless_out_of_memory(model, ids, device, "sdpa")
    row: dict[str, Any] = {"tokens": length, "sdpa_s": sdpa_s, "sdpa_peak": sdpa_peak,
                           "sdpa_tok_s": length / sdpa_s if sdpa_s else None}
    for precision in PRECISIONS:
        scan_s, scan_peak = _unless_out_of_memory(model, ids, device, FUSED[precision])
        row[precision] = {"s": scan_s, "tok_s": length / scan_s if scan_s else None,
                          "ratio": sdpa_s / scan_s if sdpa_s and scan_s else None,
                          "peak": scan_peak}
    return row


def _unless_out_of_memory(model: Any, ids: Any, device: str, name: str
                          ) -> tuple[float | None, float | None]:
    import torch

    try:
        with implementation(model, name):
            return timed_forward(model, ids, device)
    except (RuntimeError, MemoryError) as error:
        if not is_out_of_memory(error):
            raise
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
        return None, None


def within_budget(model: Any, lengths: list[int], device: str, deadline: float) -> list[dict]:
    """:func:`throughput` at each length, shortest first, skipping a length whose time,
    predicted from the last one measured (attention grows as the square of the length),
    would end past ``deadline`` (``time.monotonic()``)."""
    rows: list[dict] = []
    last: dict | None = None
    for n in sorted(lengths):
        if last is not None:
            took = (last["sdpa_s"] or 0.0) + sum(last[p]["s"] or 0.0 for p in PRECISIONS)
            predicted = took * (n / last["tokens"]) ** 2
            if time.monotonic() + predicted > deadline:
                rows.append({"tokens": n, "skipped": f"predicted {predicted:.0f} s, past the "
                                                     "time budget"})
                continue
        last = throughput(model, n, device)
        rows.append(last)
    return rows


def is_out_of_memory(error: BaseException) -> bool:
    import torch

    return isinstance(error, torch.cuda.OutOfMemoryError) or "out of memory" in str(error)


def eager_limit(model: Any, device: str, start: int, stop: int) -> int | None:
    """The shortest length, doubling from ``start`` up to ``stop``, at which the eager
    forward runs out of memory (``None``: it never did)."""
    import torch

    length = start
    while length <= stop:
        ids = torch.zeros((1, length), dtype=torch.long, device=device)
        try:
            with implementation(model, "eager"):
                timed_forward(model, ids, device)
        except (RuntimeError, MemoryError) as error:
            if not is_out_of_memory(error):
                raise
            if device.startswith("cuda"):
                torch.cuda.empty_cache()
            return length
        length *= 2
    return None


def exactness(name: str, fused: types.ModuleType, device: str, tokens: int,
              smoke: bool) -> float:
    """The largest difference, in units of ``max(1, |reference|)``, between the fused
    forward's statistics and last hidden state and eager float32's, on a two-layer model
    of shape ``name``."""
    import torch

    model = build(config(name, layers=2, smoke=smoke), device, torch.float32)
    ids = torch.randint(0, model.config.vocab_size, (1, tokens),
                        generator=torch.Generator().manual_seed(1)).to(device)
    scan = Scan(fused, keep=True)
    register(scan, FUSED["ieee"])
    with torch.inference_mode():
        with implementation(model, "eager"):
            eager = model(input_ids=ids, use_cache=False, output_attentions=True)
        with implementation(model, FUSED["ieee"]):
            got = model(input_ids=ids, use_cache=False)
    worst = _relative(got.last_hidden_state, eager.last_hidden_state)
    for layer, pattern in enumerate(eager.attentions):
        want = reference_statistics(pattern.float())
        for stat in STATS:
            worst = max(worst, _relative(getattr(scan.kept[layer], stat), want[stat]))
    del model
    return worst


def precision_gap(name: str, fused: types.ModuleType, device: str, tokens: int,
                  smoke: bool) -> dict[str, float]:
    """:class:`Gap`'s largest differences over a two-layer bfloat16 model of shape ``name``."""
    import torch

    model = build(config(name, layers=2, smoke=smoke), device, torch.bfloat16)
    ids = torch.randint(0, model.config.vocab_size, (1, tokens),
                        generator=torch.Generator().manual_seed(2)).to(device)
    gap = Gap(fused)
    register(gap, "workbench_fused_gap")
    with torch.inference_mode(), implementation(model, "workbench_fused_gap"):
        model(input_ids=ids, use_cache=False)
    del model
    return {"stats": gap.stats_gap, "output": gap.output_gap}


def _relative(got: Any, want: Any) -> float:
    return float(((got.float() - want.float()).abs() / want.float().abs().clamp_min(1)).max())


def reference_statistics(pattern: Any) -> dict[str, Any]:
    """Each row's statistics read off a whole eager pattern ``[batch, head, T, T]``."""
    import torch

    n = pattern.shape[-1]
    rows = torch.arange(n, device=pattern.device)
    previous = torch.zeros_like(pattern[..., 0])
    previous[..., 1:] = pattern.diagonal(offset=-1, dim1=-2, dim2=-1)
    gap = (rows[:, None] - rows[None, :]).abs().float()
    return {"first": pattern[..., 0], "previous": previous,
            "entropy": torch.special.entr(pattern).sum(-1),
            "distance": (pattern * gap).sum(-1)}


# ---- the run and its table ------------------------------------------------------------------

def measure_model(name: str, fused: types.ModuleType, args: argparse.Namespace) -> dict:
    """Every part for the shape ``name``."""
    import torch

    model = build(config(name, smoke=args.smoke), args.device, torch.bfloat16)
    for precision in PRECISIONS:
        register(Scan(fused, precision=precision), FUSED[precision])
    throughput(model, min(args.lengths), args.device)  # warm-up: kernels compile
    rows = within_budget(model, args.lengths, args.device, args.deadline)
    limit = eager_limit(model, args.device, args.eager_from, args.eager_to)
    out = {"model": name, "weights": weight_bytes(model), "rows": rows, "eager_oom": limit,
           "eager_to": args.eager_to}
    del model
    if args.device.startswith("cuda"):
        torch.cuda.empty_cache()
    out["exact"] = exactness(name, fused, args.device, args.exact_tokens, args.smoke)
    out["gap"] = precision_gap(name, fused, args.device, args.exact_tokens, args.smoke)
    return out


def gib(n: float | None) -> str:
    return "-" if n is None else f"{n / 2**30:.1f}"


def markdown(results: list[dict], header: str) -> str:
    """The table of every model and length (the scan's throughput and peak per precision:
    ``tensor`` / ``ieee``)."""
    lines = [header, "",
             "| model | tokens | SDPA tok/s | scan tok/s tensor / ieee | scan / SDPA tensor / "
             "ieee | scan peak GiB tensor / ieee | weights GiB | peak - weights GiB (tensor) "
             "| eager OOM at | max rel. error (f32) | tensor - ieee: stats, output |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for res in results:
        eager = (f"{res['eager_oom']:,}" if res["eager_oom"] is not None
                 else f"none to {res['eager_to']:,}")
        checks = (f"{eager} | {res['exact']:.1e} | {res['gap']['stats']:.1e}, "
                  f"{res['gap']['output']:.1e} |")
        for row in res["rows"]:
            if "skipped" in row:
                lines.append(f"| {res['model']} | {row['tokens']:,} | skipped: "
                             f"{row['skipped']} | | | | {gib(res['weights'])} | | {checks}")
                continue
            tensor, ieee = row["tensor"], row["ieee"]
            over = None if tensor["peak"] is None else tensor["peak"] - res["weights"]
            lines.append(
                f"| {res['model']} | {row['tokens']:,} | {_rate(row['sdpa_tok_s'])} | "
                f"{_rate(tensor['tok_s'])} / {_rate(ieee['tok_s'])} | "
                f"{_ratio(tensor['ratio'])} / {_ratio(ieee['ratio'])} | "
                f"{gib(tensor['peak'])} / {gib(ieee['peak'])} | {gib(res['weights'])} | "
                f"{gib(over)} | {checks}")
    return "\n".join(lines)


def _ratio(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.2f}"


def _rate(tokens_per_s: float | None) -> str:
    return "out of memory" if tokens_per_s is None else f"{tokens_per_s:,.0f}"


def environment(device: str) -> str:
    import torch
    import transformers
    import triton

    card = torch.cuda.get_device_name(device) if device.startswith("cuda") else \
        f"CPU ({platform.processor() or platform.machine()}), Triton interpreter"
    return (f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {card}; torch {torch.__version__}, "
            f"transformers {transformers.__version__}, triton {triton.__version__}")


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(SHAPES),
                   help=f"comma-separated shapes (default all: {', '.join(SHAPES)})")
    p.add_argument("--lengths", default=",".join(map(str, LENGTHS)),
                   help="comma-separated scan lengths in tokens (default 8192,32768,131072)")
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--smoke", action="store_true",
                   help="CPU, tiny shapes, Triton's interpreter (a check that it runs)")
    p.add_argument("--json", action="store_true", help="also print the results as JSON")
    p.add_argument("--budget", type=float, default=BUDGET_S,
                   help=f"seconds the throughput runs may take in all (default {BUDGET_S:g}): "
                   "a length predicted to end past it is skipped, and the table says so")
    args = p.parse_args(argv)
    args.models = [m for m in args.models.split(",") if m]
    unknown = sorted(set(args.models) - set(SHAPES))
    if unknown:
        p.error(f"unknown model shape {', '.join(unknown)}; known: {', '.join(SHAPES)}")
    args.lengths = [int(n) for n in args.lengths.split(",") if n]
    args.deadline = time.monotonic() + args.budget
    args.eager_from, args.eager_to, args.exact_tokens = EAGER_FROM, EAGER_TO, EXACT_TOKENS
    if args.smoke:
        args.device, args.lengths = "cpu", [32, 48]
        args.eager_from, args.eager_to, args.exact_tokens = 32, 64, 40
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is first imported
    import torch

    if not args.smoke and not torch.cuda.is_available():
        raise SystemExit("benchmarks/gpu.py measures a CUDA GPU and none is available "
                         "(--smoke runs it on the CPU at tiny shapes)")
    fused = kernel_module()
    header = f"benchmarks/gpu.py, {environment(args.device)}"
    results = [measure_model(name, fused, args) for name in args.models]
    sys.stdout.write(markdown(results, header) + "\n")
    if args.json:
        sys.stdout.write(json.dumps(results, default=float, indent=1) + "\n")
    worst = max(res["exact"] for res in results)
    exact = math.isfinite(worst) and worst <= EXACT_BOUND
    gaps = all(res["gap"]["stats"] <= GAP_STAT_BOUND and res["gap"]["output"] <= GAP_OUTPUT_BOUND
               for res in results)
    return 0 if exact and gaps else 1


if __name__ == "__main__":
    raise SystemExit(main())
