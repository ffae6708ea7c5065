"""Per-head statistics of attention patterns, computed while the forward pass runs.

A *pattern reduction* maps one layer's attention weights ``[batch, head_index, query_pos,
key_pos]`` to one number per prompt and head. :func:`reduce_patterns` runs the model with a
hook on every layer's ``hook_pattern`` that applies the reductions and keeps only those
numbers, so no pattern, and no activation cache, is ever held beyond the layer that made it.

Memory: the hook receives the model's own pattern tensor (for smollm2 at 8,192 tokens,
9 heads x 8192^2 x 4 B = 2.4 GB per layer: that eager pattern is the memory limit of a long
prompt, and nothing here copies it). A reduction that builds a temporary of the pattern's
size (entropy, mean distance, the induction stripe) is applied to a few heads at a time, so
that a temporary never exceeds :data:`TEMPORARY_ELEMENTS`; every reduction is per head, so
the result is the same, and prompts short enough for all heads at once take one call.

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

from workbench.core import progress
from workbench.inputs.prompts import Prompt
from workbench.models.base import Model
from workbench.recording import hooks


@dataclass
class PatternContext:
    """What a reduction may need besides the pattern."""

    input_ids: Int[Tensor, "batch pos"]
    lengths: Int[Tensor, " batch"]
    query_mask: Bool[Tensor, "batch pos"]
    layer: int
    causal: bool


TEMPORARY_ELEMENTS = 1 << 27
"""The most pattern elements a reduction is handed at once (512 MiB of float32)."""


def heads_per_call(shape: torch.Size) -> int:
    """How many heads of a ``[batch, head, query, key]`` pattern a reduction gets at once."""
    batch, n_heads, n_query, n_key = shape
    return max(1, min(n_heads, TEMPORARY_ELEMENTS // max(1, batch * n_query * n_key)))


Reduction = Callable[[Float[Tensor, "batch head_index query_pos key_pos"], PatternContext],
                     Float[Tensor, "batch head_index"]]


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
        metric, score``. ``workbench.scores.stats.summarize`` turns it into means with intervals.
    """
    batches = model.batches(prompts, max_tokens=max_batch_tokens)
    n_layers = model.info.n_layers
    frames: list[pd.DataFrame] = []
    state: dict[str, PatternContext | None] = {"ctx": None}
    batch_out: dict[tuple[int, str], Tensor] = {}

    def make_hook(layer: int):
        def hook(pattern: Tensor, hook: object) -> None:
            ctx = state["ctx"]
            assert ctx is not None
            ctx.layer = layer
            step = heads_per_call(pattern.shape)
            for metric, fn in reductions.items():
                parts = [fn(pattern[:, h:h + step], ctx)
                         for h in range(0, pattern.shape[1], step)]
                batch_out[(layer, metric)] = torch.cat(parts, dim=1).detach().float()

        return hook

    layers = sorted(set(range(n_layers) if layers is None else layers))
    fwd_hooks = [(hooks.pattern(layer), make_hook(layer)) for layer in layers]
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
