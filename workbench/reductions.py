"""Per-head statistics of attention patterns, computed while the forward pass runs.

A *pattern reduction* maps one layer's attention weights ``[batch, head_index, query_pos,
key_pos]`` to one number per prompt and head. :func:`reduce_patterns` runs the model with a
hook on every layer's ``hook_pattern`` that applies the reductions and keeps only those
numbers, so no pattern, and no activation cache, is ever held beyond the layer that made it.

Padding is handled here once: batches are right-padded, and a reduction receives a
:class:`PatternContext` whose ``query_mask`` marks the real queries; padded keys already
carry zero weight for every real query (causal models never look ahead, and padded keys
are masked out of encoders).

Examples:
    >>> per_prompt = reduce_patterns(model, prompts, {"entropy": entropy})  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from workbench import hooks, progress
from workbench.models import Model
from workbench.prompts import Prompt, make_batches


@dataclass
class PatternContext:
    """What a reduction may need besides the pattern."""

    input_ids: Int[Tensor, "batch pos"]
    lengths: Int[Tensor, " batch"]
    query_mask: Bool[Tensor, "batch pos"]
    layer: int
    causal: bool


Reduction = Callable[[Float[Tensor, "batch head_index query_pos key_pos"], PatternContext],
                     Float[Tensor, "batch head_index"]]


def masked_query_mean(values: Float[Tensor, "batch head_index query_pos"],
                      mask: Bool[Tensor, "batch query_pos"]) -> Float[Tensor, "batch head_index"]:
    """Mean over the queries where ``mask`` is true (NaN for a prompt with none)."""
    mask_f = mask[:, None, :].to(values.dtype)
    total = (values * mask_f).sum(-1)
    count = mask_f.sum(-1)
    return total / count.where(count > 0, torch.full_like(count, float("nan")))


def entropy(pattern: Float[Tensor, "batch head_index query_pos key_pos"],
            ctx: PatternContext) -> Float[Tensor, "batch head_index"]:
    """Mean entropy (nats) of each query's attention distribution (Clark et al. 2019)."""
    p = pattern.float()
    h = -(p * torch.log(p.clamp_min(1e-30))).sum(-1)
    return masked_query_mean(h, ctx.query_mask)


def normalized_entropy(pattern: Float[Tensor, "batch head_index query_pos key_pos"],
                       ctx: PatternContext) -> Float[Tensor, "batch head_index"]:
    """Entropy divided by its maximum, log(number of keys the query can see).

    1 means uniform over the visible keys, 0 means all weight on one key. Queries that see
    a single key (the first position of a causal model) are left out.
    """
    p = pattern.float()
    h = -(p * torch.log(p.clamp_min(1e-30))).sum(-1)
    n_pos = pattern.shape[-1]
    pos = torch.arange(n_pos)
    visible = (pos + 1)[None, :].expand(len(ctx.lengths), -1) if ctx.causal else \
        ctx.lengths[:, None].expand(-1, n_pos)
    mask = ctx.query_mask & (visible > 1)
    return masked_query_mean(h / visible.clamp_min(2).log()[:, None, :], mask)


def mean_distance(pattern: Float[Tensor, "batch head_index query_pos key_pos"],
                  ctx: PatternContext) -> Float[Tensor, "batch head_index"]:
    """Expected |query - key| distance in tokens under the attention weights."""
    n_pos = pattern.shape[-1]
    pos = torch.arange(n_pos, dtype=torch.float32)
    dist = (pos[:, None] - pos[None, :]).abs()
    return masked_query_mean((pattern.float() * dist).sum(-1), ctx.query_mask)


def self_attention(pattern: Float[Tensor, "batch head_index query_pos key_pos"],
                   ctx: PatternContext) -> Float[Tensor, "batch head_index"]:
    """Mean weight a token puts on itself."""
    diag = pattern.float().diagonal(dim1=-2, dim2=-1)
    return masked_query_mean(diag, ctx.query_mask)


def reduce_patterns(model: Model, prompts: Sequence[Prompt],
                    reductions: Mapping[str, Reduction], *,
                    max_batch_tokens: int = 2048, desc: str = "scoring",
                    layers: Sequence[int] | None = None) -> pd.DataFrame:
    """Apply pattern reductions to every head of every layer, on the fly.

    Args:
        model: the model.
        prompts: the prompts (any lengths).
        reductions: ``{metric name: reduction}``.
        max_batch_tokens: batch size in tokens.
        layers: only these layers (the pass stops after the deepest); default all.

    Returns:
        Long format, one row per (prompt, layer, head, metric): ``prompt, layer, head,
        metric, score``. ``workbench.stats.summarize`` turns it into means with intervals.
    """
    encoded = [model.encode(p) for p in prompts]
    n_layers = model.info.n_layers
    pad_id = model.tokenizer.pad_token_id or 0
    frames: list[pd.DataFrame] = []
    state: dict[str, PatternContext | None] = {"ctx": None}
    batch_out: dict[tuple[int, str], Tensor] = {}

    def make_hook(layer: int):
        def hook(pattern: Tensor, hook: object) -> None:
            ctx = state["ctx"]
            assert ctx is not None
            ctx.layer = layer
            for metric, fn in reductions.items():
                batch_out[(layer, metric)] = fn(pattern, ctx).detach().float()

        return hook

    layers = sorted(set(range(n_layers) if layers is None else layers))
    fwd_hooks = [(hooks.pattern(layer), make_hook(layer)) for layer in layers]
    batches = list(make_batches(encoded, pad_id=pad_id, max_tokens=max_batch_tokens))
    with torch.inference_mode():
        for batch in progress.track(batches, desc=desc):
            lengths = torch.tensor(batch.lengths)
            state["ctx"] = PatternContext(
                input_ids=batch.input_ids, lengths=lengths,
                query_mask=batch.attention_mask.bool(), layer=-1, causal=model.info.causal,
            )
            batch_out.clear()
            hooks.run_hooked(model.bridge, batch, fwd_hooks,
                             stop_after=hooks.pattern(layers[-1]))
            frames.append(_to_frame(batch_out, batch.indices))
    return pd.concat(frames, ignore_index=True).sort_values(
        ["prompt", "layer", "head", "metric"], ignore_index=True)


def uniform_pattern(n: int, causal: bool) -> Float[Tensor, "1 1 query_pos key_pos"]:
    """Attention spread evenly over the keys each query can see: the null pattern."""
    visible = torch.ones(n, n).tril() if causal else torch.ones(n, n)
    return (visible / visible.sum(-1, keepdim=True))[None, None]


def null_scores(model: Model, prompts: Sequence[Prompt],
                reductions: Mapping[str, Reduction]) -> pd.DataFrame:
    """Each reduction applied to the uniform pattern of every prompt (no forward pass).

    This is what a score would be for a head that attends evenly to everything it can
    see, so a reader knows what "high" means for that score on those prompts.

    Returns:
        ``prompt, metric, score`` (the same for every head).
    """
    rows = []
    for i, prompt in enumerate(prompts):
        ids, _ = model.encode(prompt)
        n = len(ids)
        ctx = PatternContext(input_ids=torch.tensor([ids]), lengths=torch.tensor([n]),
                             query_mask=torch.ones(1, n, dtype=torch.bool), layer=-1,
                             causal=model.info.causal)
        pattern = uniform_pattern(n, model.info.causal)
        for metric, fn in reductions.items():
            rows.append((i, metric, float(fn(pattern, ctx)[0, 0])))
    return pd.DataFrame(rows, columns=["prompt", "metric", "score"])


def _to_frame(batch_out: Mapping[tuple[int, str], Tensor], indices: list[int]) -> pd.DataFrame:
    frames = []
    for (layer, metric), scores in batch_out.items():
        n_rows, n_heads = scores.shape
        frames.append(pd.DataFrame({
            "prompt": np.repeat(indices, n_heads),
            "layer": layer,
            "head": np.tile(np.arange(n_heads), n_rows),
            "metric": metric,
            "score": scores.reshape(-1).numpy(),
        }))
    return pd.concat(frames, ignore_index=True)
